"""The golden corpus of partition key arithmetic, produced by Airflow 3.3.2's own code.

Run with the Airflow virtualenv's python (bin/airflow-worker builds it):

    .venv-airflow-worker/bin/python tools/partition_golden.py --write   # writes GOLDEN
    .venv-airflow-worker/bin/python tools/partition_golden.py           # the same JSON on stdout

Each mapper case is a mapper in the service's definition form (`kind` ..., the JSON shape
`assets_app.definitions.partitions.mapper_from_spec` reads) run through Airflow as a Dag file and
its scheduler meet it: the Task SDK class is built from the spec (`airflow.sdk.StartOfDayMapper`
...), encoded by `airflow.serialization.encoders.encode_partition_mapper` (what the serialized Dag
carries), translated back to the service form by `spec_from_airflow` (what the worker's
conversion will carry, checked to be the spec itself) and decoded by
`airflow.serialization.decoders.decode_partition_mapper` into the core class the scheduler calls
(`airflow/partition_mappers/*.py`). A construction that raises (in the SDK, at parse time, or in
core, at decode) is recorded as the case's `error`. Otherwise every call is recorded with
Airflow's answer or its exception (class name and message):

- `to_downstream` key: `PartitionMapper.to_downstream` (a key, or a list of keys for a fan-out);
- `queue` [key, global cap]: the keys `AssetManager` (airflow/assets/manager.py,
  `_queue_partitioned_dags`) queues for one event, the per-mapper `max_downstream_keys` or the
  `[scheduler] partition_mapper_max_downstream_keys` cap (default 1000) applied as it does there
  (the mapper's cap read from the decoded core object), or `FanOutExceeded` with its log line;
- `to_upstream` key (rollups): `RollupMapper.to_upstream`, the keys a downstream key waits for
  (a frozenset in Airflow, sorted here);
- `partition_date` key: `to_partition_date`, the run's `partition_date` (ISO 8601 or null);
- `satisfied` [key, matched keys]: the rollup's `wait_policy.is_satisfied_by_keys(matched,
  expected=to_upstream(key))` as `SchedulerJobRunner._resolve_asset_partition_status` asks it:
  [satisfied, unreachable, unreachable_reason].

Timetable cases drive `airflow.timetables.trigger.CronPartitionTimetable` (built the same way,
SDK -> encode -> decode): `partition_info` run date -> [partition_date, partition_key]
(`_get_partition_info`, the key a scheduled run gets), `iter` [earliest, latest] ->
`iter_partition_dagrun_infos` (a backfill's partitions) and `decode` key ->
`resolve_partition_date`. Instants are ISO 8601 with offset.

Timetable cases also drive `airflow.timetables.simple.PartitionedAssetTimetable`:
`mapper_for` [name, uri] -> the spec of `get_partition_mapper(name=, uri=)`, and `partition_date`
key -> `resolve_partition_date`.

Example cases bag airflow/example_dags/example_asset_partition.py with Airflow's BundleDagBag
(as the dag-processor does) and record every partitioned Dag's timetable and each distinct
mapper it uses, called with `keys` (the keys one event queues, sorted: a segment fan-out yields
them in a frozenset's order) and follow-ups chosen from Airflow's own answers.

Deterministic: fixed inputs, no randomness, set-ordered answers sorted; the output is sorted
JSON, one case a line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pendulum
import structlog
from airflow import sdk
from airflow.serialization.decoders import decode_partition_mapper, decode_timetable
from airflow.serialization.encoders import encode_partition_mapper, encode_timetable

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "partitions" / "golden.json"
DEFAULT_GLOBAL_CAP = (
    1000  # airflow/config_templates/config.yml partition_mapper_max_downstream_keys
)

TEMPORAL = {
    "start_of_hour": "StartOfHourMapper",
    "start_of_day": "StartOfDayMapper",
    "start_of_week": "StartOfWeekMapper",
    "start_of_month": "StartOfMonthMapper",
    "start_of_quarter": "StartOfQuarterMapper",
    "start_of_year": "StartOfYearMapper",
}
WINDOWS = {
    "hour": "HourWindow",
    "day": "DayWindow",
    "week": "WeekWindow",
    "month": "MonthWindow",
    "quarter": "QuarterWindow",
    "year": "YearWindow",
    "segment": "SegmentWindow",
}
KIND_OF = {v: k for k, v in TEMPORAL.items()} | {
    "IdentityMapper": "identity",
    "AllowedKeyMapper": "allowed_key",
    "FixedKeyMapper": "fixed_key",
    "ProductMapper": "product",
    "ChainMapper": "chain",
    "RollupMapper": "rollup",
    "FanOutMapper": "fan_out",
}
WINDOW_KIND_OF = {v: k for k, v in WINDOWS.items()}


# --- spec -> Task SDK object (what a Dag file builds) ---------------------------------------


def _cap(spec: dict[str, Any]) -> dict[str, Any]:
    return (
        {"max_downstream_keys": spec["max_downstream_keys"]}
        if "max_downstream_keys" in spec
        else {}
    )


def build_window(spec: dict[str, Any]) -> Any:
    cls = getattr(sdk, WINDOWS[spec["kind"]])
    if spec["kind"] == "segment":
        return cls(spec["segments"])
    return cls(direction=sdk.Window.Direction(spec.get("direction", "forward")))


def build_policy(spec: dict[str, Any] | None) -> Any:
    if spec is None or spec["kind"] == "wait_for_all":
        return sdk.WaitForAll()
    return sdk.MinimumCount(spec["n"])


def build_mapper(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind in TEMPORAL:
        kwargs = {k: spec[k] for k in ("timezone", "input_format", "output_format") if k in spec}
        if isinstance(kwargs.get("timezone"), int):
            # a fixed offset in seconds, as encode_timezone writes a pendulum FixedTimezone
            kwargs["timezone"] = pendulum.fixed_timezone(kwargs["timezone"])
        return getattr(sdk, TEMPORAL[kind])(**kwargs, **_cap(spec))
    if kind == "identity":
        return sdk.IdentityMapper(**_cap(spec))
    if kind == "allowed_key":
        return sdk.AllowedKeyMapper(spec["allowed_keys"], **_cap(spec))
    if kind == "fixed_key":
        return sdk.FixedKeyMapper(spec["downstream_key"], **_cap(spec))
    if kind in ("product", "chain"):
        children = [build_mapper(m) for m in spec["mappers"]]
        extra = {"delimiter": spec["delimiter"]} if "delimiter" in spec else {}
        cls = sdk.ProductMapper if kind == "product" else sdk.ChainMapper
        return cls(*children, **extra, **_cap(spec))
    if kind == "rollup":
        return sdk.RollupMapper(
            upstream_mapper=build_mapper(spec["upstream_mapper"]),
            window=build_window(spec["window"]),
            wait_policy=build_policy(spec.get("wait_policy")),
            **_cap(spec),
        )
    if kind == "fan_out":
        downstream = spec.get("downstream_mapper")
        return sdk.FanOutMapper(
            upstream_mapper=build_mapper(spec["upstream_mapper"]),
            window=build_window(spec["window"]),
            downstream_mapper=build_mapper(downstream) if downstream else None,
            **_cap(spec),
        )
    raise AssertionError(kind)


# --- Airflow's serialized form -> the service's spec (what the worker's conversion carries) --


def spec_from_airflow(encoded: dict[str, Any]) -> dict[str, Any]:
    """A mapper as `encode_partition_mapper` serializes it, in the service's definition form."""
    name = encoded["__type"].rsplit(".", 1)[1]
    var = encoded["__var"]
    spec: dict[str, Any] = {"kind": KIND_OF[name]}
    if name in TEMPORAL.values():
        spec |= {k: var[k] for k in ("timezone", "input_format", "output_format")}
    elif name == "AllowedKeyMapper":
        spec["allowed_keys"] = list(var["allowed_keys"])
    elif name == "FixedKeyMapper":
        spec["downstream_key"] = var["downstream_key"]
    elif name in ("ProductMapper", "ChainMapper"):
        if name == "ProductMapper":
            spec["delimiter"] = var["delimiter"]
        spec["mappers"] = [spec_from_airflow(m) for m in var["mappers"]]
    elif name in ("RollupMapper", "FanOutMapper"):
        spec["upstream_mapper"] = spec_from_airflow(var["upstream_mapper"])
        window = var["window"]
        wkind = WINDOW_KIND_OF[window["__type"].rsplit(".", 1)[1]]
        spec["window"] = {"kind": wkind, **window["__var"]}
        if name == "RollupMapper":
            policy = var["wait_policy"]
            pname = policy["__type"].rsplit(".", 1)[1]
            spec["wait_policy"] = (
                {"kind": "wait_for_all"}
                if pname == "WaitForAll"
                else {"kind": "minimum_count", "n": policy["__var"]["n"]}
            )
        else:
            spec["downstream_mapper"] = spec_from_airflow(var["downstream_mapper"])
    if "max_downstream_keys" in var:
        spec["max_downstream_keys"] = var["max_downstream_keys"]
    return spec


def _plain(value: Any) -> Any:
    """Encoding enums as their strings (JSON round trip)."""
    return json.loads(json.dumps(value))


# --- recording ------------------------------------------------------------------------------


def error(exc: BaseException) -> dict[str, Any]:
    return {"error": [type(exc).__name__, str(exc)]}


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def call(core: Any, op: str, arg: Any) -> dict[str, Any]:
    try:
        if op == "to_downstream":
            out = core.to_downstream(arg)
            return {"ok": out if isinstance(out, str) else list(out)}
        if op == "queue":
            return queue(core, *arg)
        if op == "keys":  # the keys one event queues, as a sorted list (a set's order varies)
            queued = queue(core, arg, DEFAULT_GLOBAL_CAP)
            return {"ok": sorted(queued["ok"])} if "ok" in queued else queued
        if op == "to_upstream":
            return {"ok": sorted(core.to_upstream(arg))}
        if op == "partition_date":
            return {"ok": iso(core.to_partition_date(arg))}
        if op == "satisfied":
            key, matched = arg
            result = core.wait_policy.is_satisfied_by_keys(
                matched=set(matched), expected=core.to_upstream(key)
            )
            return {"ok": [result.satisfied, result.unreachable, result.unreachable_reason]}
    except Exception as exc:
        return error(exc)
    raise AssertionError(op)


def queue(core: Any, key: str, global_cap: int) -> dict[str, Any]:
    """airflow/assets/manager.py `_queue_partitioned_dags`, from `target_key =
    mapper.to_downstream(partition_key)` to the fan-out check (its Log line's words)."""
    from airflow.utils.helpers import is_container

    target_key = core.to_downstream(key)
    target_keys = list(target_key) if is_container(target_key) else [target_key]
    mapper_cap = core.max_downstream_keys
    if mapper_cap is not None:
        cap, source = mapper_cap, f"max_downstream_keys={mapper_cap}"
    else:
        cap = global_cap
        source = f"[scheduler] partition_mapper_max_downstream_keys={global_cap}"
    if len(target_keys) > cap:
        return {
            "error": [
                "FanOutExceeded",
                f"produced {len(target_keys)} downstream keys from partition_key='{key}', "
                f"exceeding {source}.",
            ]
        }
    return {"ok": target_keys}


def mapper_case(name: str, spec: dict[str, Any], calls: list[tuple[str, Any]]) -> dict[str, Any]:
    case: dict[str, Any] = {"name": name, "mapper": spec}
    try:
        encoded = _plain(encode_partition_mapper(build_mapper(spec)))
    except Exception as exc:
        return case | {"stage": "sdk"} | error(exc)
    carried = spec_from_airflow(encoded)
    case["mapper"] = carried  # the canonical form: every default filled in, as carried
    try:
        core = decode_partition_mapper(encoded)
    except Exception as exc:
        return case | {"stage": "core"} | error(exc)
    case["calls"] = [[op, arg, call(core, op, arg)] for op, arg in calls]
    return case


# --- the inputs -----------------------------------------------------------------------------

ZONES = [
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Santiago",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
]

# Seconds keys (the default input format): ordinary, calendar edges, and each zone's DST days
# (Europe 2024-03-31 / 2024-10-27, US 2024-03-10 / 2024-11-03, Santiago 2024-04-06 / 2024-09-07,
# Lord Howe 2024-04-07 / 2024-10-06), in the skipped and the repeated wall times.
SECOND_KEYS = [
    "2024-03-13T10:42:15",
    "2024-02-29T23:59:59",
    "2024-12-31T23:59:59",
    "2025-01-01T00:00:00",
    "2021-01-03T12:00:00",
    "2024-12-30T00:30:00",
    "2024-03-31T00:30:00",
    "2024-03-31T01:30:00",
    "2024-03-31T02:30:00",
    "2024-10-27T00:30:00",
    "2024-10-27T01:30:00",
    "2024-10-27T02:30:00",
    "2024-03-10T02:30:00",
    "2024-11-03T00:15:00",
    "2024-11-03T01:30:00",
    "2024-04-06T23:30:00",
    "2024-09-08T00:30:00",
    "2024-04-07T01:45:00",
    "2024-10-06T02:15:00",
    "2024-06-30T23:00:00",
    "2024-09-30T22:00:00",
]
BAD_KEYS = [
    "",
    "not a key",
    "2024-13-01T00:00:00",
    "2024-02-30T00:00:00",
    "2024-03-13",
    "2024-03-13T10:42:15Z",
    " 2024-03-13T10:42:15",
    "2024-03-13T24:00:00",
]
AWARE_KEYS = [
    "2024-03-31T00:30:00+0000",
    "2024-03-31T01:30:00+00:00",
    "2024-10-27T00:30:00+0000",
    "2024-10-27T01:30:00+0100",
    "2024-11-03T05:30:00+0000",
    "2024-11-03T06:30:00+0000",
    "2024-03-10T07:30:00+0000",
    "2024-12-31T23:30:00-0500",
    "2024-03-13T10:42:15",
]
HOUR_KEYS_BY_DAY = ["2024-03-13", "2024-03-31", "2024-10-27", "2024-03-10", "2024-11-03"]


def temporal_cases() -> list[dict[str, Any]]:
    cases = []
    for kind in TEMPORAL:
        for tz in ZONES:
            spec = {"kind": kind, "timezone": tz}
            calls: list[tuple[str, Any]] = [("to_downstream", k) for k in SECOND_KEYS]
            calls += [("to_downstream", k) for k in BAD_KEYS]
            cases.append(mapper_case(f"{kind} {tz}", spec, calls))
        # an aware input format: the instant converted to the zone first
        for tz in ("America/New_York", "Europe/Berlin"):
            spec = {"kind": kind, "timezone": tz, "input_format": "%Y-%m-%dT%H:%M:%S%z"}
            calls = [("to_downstream", k) for k in AWARE_KEYS]
            cases.append(mapper_case(f"{kind} {tz} aware input", spec, calls))
    # the downstream keys back to the run's partition_date (the scheduler's anchor)
    date_keys = {
        "start_of_hour": ["2024-03-13T10", "2024-03-10T02", "2024-11-03T01", "2024-03-31T02", "x"],
        "start_of_day": ["2024-03-13", "2024-03-10", "2024-11-03", "2024-10-27", "2024-02-30"],
        "start_of_week": [
            "2024-03-11 (W11)",
            "2024-03-13 (W11)",
            "2024-12-30 (W01)",
            "2024-03-11",
            "2024-03-11 (W1)",
        ],
        "start_of_month": ["2024-03", "2024-02", "2024-13", "2024-3"],
        "start_of_quarter": ["2024-Q1", "2024-Q4", "2024-Q5", "2024-Q0", "2024Q1"],
        "start_of_year": ["2024", "0999", "99999"],
    }
    for kind, keys in date_keys.items():
        for tz in (
            "UTC",
            "America/New_York",
            "Europe/London",
            "Asia/Kolkata",
            "Australia/Lord_Howe",
        ):
            spec = {"kind": kind, "timezone": tz}
            cases.append(
                mapper_case(
                    f"{kind} {tz} partition_date", spec, [("partition_date", k) for k in keys]
                )
            )
    # formats: custom ones, ones that need %z, malformed ones core refuses at decode
    formats = [
        ("start_of_day", "%Y%m%d%H", "%Y/%m/%d", ["2024033102", "2024-03-31", "20240331"]),
        ("start_of_day", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d%z", ["2024-03-31T12:00:00"]),
        ("start_of_hour", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H%z", SECOND_KEYS[6:19]),
        ("start_of_hour", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H %Z", SECOND_KEYS[6:19]),
        ("start_of_week", "%Y-%m-%d", "%G-W%V", ["2024-12-30", "2021-01-03"]),
        ("start_of_week", "%Y-%m-%d", "W%V %d.%m.%Y", ["2024-12-30", "2024-02-29"]),
        ("start_of_week", "%Y-%m-%d", "%Y-%m-%d %Y", ["2024-12-30"]),
        ("start_of_week", "%Y-%m-%d", "%Y {a}{b}", ["2024-12-30"]),
        ("start_of_quarter", "%Y-%m-%d", "Q{quarter} %Y", ["2024-05-01", "2024-12-31"]),
        ("start_of_quarter", "%Y-%m-%d", "%Y-Q{quarter}-%m", ["2024-05-01"]),
        ("start_of_quarter", "%Y-%m-%d", "{year}-Q{quarter}", ["2024-05-01"]),
        ("start_of_quarter", "%Y-%m-%d", "%Y-Q{}", ["2024-05-01"]),
        ("start_of_quarter", "%Y-%m-%d", "%Y-Q{quarter}{quarter}", ["2024-05-01"]),
        ("start_of_quarter", "%Y-%m-%d", "%Y-{x}{y}-Q{quarter}", ["2024-05-01"]),
        ("start_of_quarter", "%Y-%m-%d", "%Y-{x}{quarter}{y}-Q{", ["2024-05-01"]),
        ("start_of_month", "%d/%m/%Y", "%m.%Y", ["31/12/2024", "1/2/2024", "2024-01-01"]),
        ("start_of_year", "%Y", "%Y", ["2024", "24"]),
    ]
    for kind, fin, fout, keys in formats:
        spec = {
            "kind": kind,
            "timezone": "America/New_York",
            "input_format": fin,
            "output_format": fout,
        }
        calls = [("to_downstream", k) for k in keys]
        calls += [("partition_date", k) for k in keys]
        cases.append(mapper_case(f"{kind} {fin} -> {fout}", spec, calls))
    # time zones given as fixed offsets and unknown names
    cases.append(
        mapper_case(
            "start_of_day +05:30 offset",
            {"kind": "start_of_day", "timezone": 19800},
            [("to_downstream", "2024-03-13T20:00:00"), ("partition_date", "2024-03-13")],
        )
    )
    cases.append(
        mapper_case("unknown zone", {"kind": "start_of_day", "timezone": "Mars/Olympus"}, [])
    )
    return cases


def simple_cases() -> list[dict[str, Any]]:
    keys = ["a", "", "2024-03-13T10:42:15", "us|eu", " a "]
    cases = [
        mapper_case("identity", {"kind": "identity"}, [("to_downstream", k) for k in keys]),
        mapper_case(
            "allowed_key",
            {"kind": "allowed_key", "allowed_keys": ["us", "eu", "apac"]},
            [("to_downstream", k) for k in ["us", "eu", "EU", "", "us "]]
            + [("partition_date", "us")],
        ),
        mapper_case(
            "fixed_key",
            {"kind": "fixed_key", "downstream_key": "all"},
            [("to_downstream", k) for k in keys] + [("partition_date", "all")],
        ),
        mapper_case("fixed_key empty", {"kind": "fixed_key", "downstream_key": ""}, []),
    ]
    for bad in (0, -1, "3", 2.5):
        cases.append(
            mapper_case(f"cap {bad!r}", {"kind": "identity", "max_downstream_keys": bad}, [])
        )
    cases.append(
        mapper_case(
            "cap on identity",
            {"kind": "identity", "max_downstream_keys": 1},
            [("queue", ["a", 1000]), ("queue", ["a", 1])],
        )
    )
    return cases


def composite_cases() -> list[dict[str, Any]]:
    day_ny = {"kind": "start_of_day", "timezone": "America/New_York"}
    hour = {"kind": "start_of_hour"}
    region = {"kind": "allowed_key", "allowed_keys": ["us", "eu"]}
    cases = [
        mapper_case(
            "product day|region",
            {"kind": "product", "mappers": [day_ny, region]},
            [
                ("to_downstream", "2024-11-03T01:30:00|us"),
                ("to_downstream", "2024-11-03T01:30:00|apac"),
                ("to_downstream", "2024-11-03T01:30:00"),
                ("to_downstream", "2024-11-03T01:30:00|us|x"),
                ("to_downstream", "bad|us"),
                ("partition_date", "2024-11-03|us"),
                ("partition_date", "2024-11-03"),
                ("partition_date", "2024-11-03|us|x"),
            ],
        ),
        mapper_case(
            "product with ':' delimiter",
            {"kind": "product", "delimiter": ":", "mappers": [{"kind": "identity"}, region]},
            [("to_downstream", "x:us"), ("to_downstream", "2024-03-13T10:42:15:us")],
        ),
        mapper_case(
            "product two temporal",
            {"kind": "product", "mappers": [day_ny, hour]},
            [
                ("to_downstream", "2024-03-10T12:00:00|2024-03-10T12:34:56"),
                ("partition_date", "2024-03-10|2024-03-10T12"),
            ],
        ),
        mapper_case(
            "product three with identity",
            {"kind": "product", "delimiter": "/", "mappers": [region, {"kind": "identity"}, hour]},
            [
                ("to_downstream", "us/x/2024-03-13T10:42:15"),
                ("partition_date", "us/x/2024-03-13T10"),
            ],
        ),
        mapper_case(
            "product of a fan-out",
            {
                "kind": "product",
                "mappers": [
                    {
                        "kind": "fan_out",
                        "upstream_mapper": {"kind": "start_of_week"},
                        "window": {"kind": "week"},
                    },
                    region,
                ],
            },
            [("to_downstream", "2024-03-13T10:42:15|us")],
        ),
        mapper_case(
            "chain hour -> day",
            {
                "kind": "chain",
                "mappers": [hour, {"kind": "start_of_day", "input_format": "%Y-%m-%dT%H"}],
            },
            [
                ("to_downstream", "2024-03-13T10:42:15"),
                ("to_downstream", "2024-03-13"),
                ("partition_date", "2024-03-13"),
                ("partition_date", "2024-03-13T10"),
            ],
        ),
        mapper_case(
            "chain week fan-out -> month (duplicates kept)",
            {
                "kind": "chain",
                "mappers": [
                    {
                        "kind": "fan_out",
                        "upstream_mapper": {"kind": "start_of_week"},
                        "window": {"kind": "week"},
                    },
                    {"kind": "start_of_month", "input_format": "%Y-%m-%d"},
                ],
            },
            [
                ("to_downstream", "2024-04-03T00:00:00"),
                ("to_downstream", "2024-03-13T10:42:15"),
                ("queue", ["2024-04-03T00:00:00", 1000]),
                ("queue", ["2024-04-03T00:00:00", 6]),
            ],
        ),
        mapper_case(
            "chain of three with allowed keys",
            {
                "kind": "chain",
                "mappers": [
                    {"kind": "identity"},
                    region,
                    {"kind": "fixed_key", "downstream_key": "z"},
                ],
            },
            [("to_downstream", "us"), ("to_downstream", "apac"), ("partition_date", "z")],
        ),
    ]
    return cases


def rollup_cases() -> list[dict[str, Any]]:
    cases = []
    up = {
        "hour": (
            "start_of_hour",
            "%Y-%m-%dT%H:%M",
            ["2024-03-13T10", "2024-03-10T02", "2024-11-03T01"],
        ),
        "day": (
            "start_of_day",
            "%Y-%m-%dT%H",
            [
                *HOUR_KEYS_BY_DAY,
                "2024-04-06",
                "2024-09-07",
                "2024-09-08",
                "2024-04-07",
                "2024-10-06",
            ],
        ),
        "week": (
            "start_of_week",
            "%Y-%m-%d",
            ["2024-03-25 (W13)", "2024-10-21 (W43)", "2024-12-30 (W01)", "2024-03-27 (W13)"],
        ),
        "month": (
            "start_of_month",
            "%Y-%m-%d",
            ["2024-02", "2024-03", "2024-10", "2025-01", "2023-02"],
        ),
        "quarter": ("start_of_quarter", "%Y-%m", ["2024-Q1", "2024-Q4", "2025-Q1"]),
        "year": ("start_of_year", "%Y-%m", ["2024", "2025"]),
    }
    for window, (kind, fin, keys) in up.items():
        for direction in ("forward", "backward"):
            zones = (
                ZONES if window in ("hour", "day") else ["UTC", "America/New_York", "Europe/Berlin"]
            )
            for tz in zones:
                spec = {
                    "kind": "rollup",
                    "upstream_mapper": {"kind": kind, "timezone": tz, "input_format": fin},
                    "window": {"kind": window, "direction": direction},
                }
                calls: list[tuple[str, Any]] = [("to_upstream", k) for k in keys]
                calls += [("to_upstream", "garbage"), ("partition_date", keys[0])]
                cases.append(mapper_case(f"rollup {window} {direction} {tz}", spec, calls))
    # a day window on hourly UTC-offset keys (Airflow's advice for DST), and on %z downstream keys
    cases.append(
        mapper_case(
            "rollup day with %z formats",
            {
                "kind": "rollup",
                "upstream_mapper": {
                    "kind": "start_of_day",
                    "timezone": "America/New_York",
                    "input_format": "%Y-%m-%dT%H%z",
                    "output_format": "%Y-%m-%d%z",
                },
                "window": {"kind": "day"},
            },
            [
                ("to_downstream", "2024-03-10T07-0400"),
                ("to_downstream", "2024-11-03T05+0000"),
                ("to_upstream", "2024-03-10-0500"),
                ("to_upstream", "2024-11-03-0400"),
                ("partition_date", "2024-03-10-0500"),
            ],
        )
    )
    # windows that need day 1, fed a Monday
    cases.append(
        mapper_case(
            "rollup week mapper in a month window",
            {
                "kind": "rollup",
                "upstream_mapper": {"kind": "start_of_week", "input_format": "%Y-%m-%d"},
                "window": {"kind": "month"},
            },
            [
                ("to_upstream", "2024-03-11 (W11)"),
                ("to_upstream", "2024-04-01 (W14)"),
                ("to_downstream", "2024-03-13"),
            ],
        )
    )
    cases.append(
        mapper_case(
            "rollup day mapper in a year window",
            {
                "kind": "rollup",
                "upstream_mapper": {"kind": "start_of_day"},
                "window": {"kind": "year", "direction": "backward"},
            },
            [("to_upstream", "2024-03-13"), ("to_upstream", "2024-01-01")],
        )
    )
    # type mismatches, refused at construction
    cases.append(
        mapper_case(
            "rollup identity in a day window",
            {"kind": "rollup", "upstream_mapper": {"kind": "identity"}, "window": {"kind": "day"}},
            [],
        )
    )
    cases.append(
        mapper_case(
            "rollup day in a segment window",
            {
                "kind": "rollup",
                "upstream_mapper": {"kind": "start_of_day"},
                "window": {"kind": "segment", "segments": ["a"]},
            },
            [],
        )
    )
    # categorical rollup
    segments = {
        "kind": "rollup",
        "upstream_mapper": {"kind": "fixed_key", "downstream_key": "all"},
        "window": {"kind": "segment", "segments": ["us", "eu", "apac", "eu"]},
    }
    cases.append(
        mapper_case(
            "rollup segments",
            segments,
            [
                ("to_downstream", "us"),
                ("to_upstream", "all"),
                ("to_upstream", "other"),
                ("partition_date", "all"),
                ("satisfied", ["all", ["us", "eu"]]),
                ("satisfied", ["all", ["us", "eu", "apac"]]),
                ("satisfied", ["all", ["us", "eu", "apac", "xx"]]),
            ],
        )
    )
    for bad in ([], [""], ["a", 3]):
        spec = dict(segments, window={"kind": "segment", "segments": bad})
        cases.append(mapper_case(f"segments {bad!r}", spec, []))
    # wait policies over a 24-key day window and the segment window
    day = {"kind": "start_of_day", "input_format": "%Y-%m-%dT%H"}
    all_hours = [f"2024-03-13T{h:02d}" for h in range(24)]
    matched_sets = [
        [],
        all_hours[:3],
        all_hours[:21],
        all_hours[:22],
        all_hours[:23],
        all_hours,
        [*all_hours[1:], "2024-03-14T00"],
    ]
    for policy in (
        {"kind": "wait_for_all"},
        {"kind": "minimum_count", "n": 3},
        {"kind": "minimum_count", "n": -2},
        {"kind": "minimum_count", "n": 24},
        {"kind": "minimum_count", "n": 25},
        {"kind": "minimum_count", "n": -30},
    ):
        spec = {
            "kind": "rollup",
            "upstream_mapper": day,
            "window": {"kind": "day"},
            "wait_policy": policy,
        }
        calls = [("satisfied", ["2024-03-13", m]) for m in matched_sets]
        calls.append(("satisfied", ["bad", []]))
        cases.append(mapper_case(f"wait policy {policy}", spec, calls))
        seg = dict(segments, wait_policy=policy)
        cases.append(
            mapper_case(f"wait policy {policy} segments", seg, [("satisfied", ["all", ["us"]])])
        )
    cases.append(
        mapper_case(
            "minimum count 0",
            {
                "kind": "rollup",
                "upstream_mapper": day,
                "window": {"kind": "day"},
                "wait_policy": {"kind": "minimum_count", "n": 0},
            },
            [],
        )
    )
    cases.append(
        mapper_case(
            "rollup with a cap",
            {
                "kind": "rollup",
                "upstream_mapper": day,
                "window": {"kind": "day"},
                "max_downstream_keys": 2,
            },
            [("queue", ["2024-03-13T05", 1000]), ("to_upstream", "2024-03-13")],
        )
    )
    return cases


def fan_out_cases() -> list[dict[str, Any]]:
    cases = []
    combos = [
        (
            "start_of_week",
            "week",
            None,
            ["2024-03-13T10:42:15", "2024-12-31T00:00:00", "2024-03-31T02:30:00"],
        ),
        (
            "start_of_month",
            "month",
            None,
            ["2024-02-10T00:00:00", "2024-03-31T12:00:00", "2023-02-01T00:00:00"],
        ),
        (
            "start_of_day",
            "day",
            None,
            ["2024-03-10T12:00:00", "2024-11-03T12:00:00", "2024-03-31T00:00:00"],
        ),
        ("start_of_quarter", "quarter", None, ["2024-05-05T00:00:00", "2024-12-31T23:59:59"]),
        ("start_of_year", "year", None, ["2024-07-01T00:00:00"]),
        (
            "start_of_hour",
            "hour",
            {"kind": "start_of_hour", "output_format": "%Y-%m-%dT%H:%M"},
            ["2024-03-10T02:30:00"],
        ),
        ("start_of_week", "week", {"kind": "identity"}, ["2024-03-13T10:42:15"]),
        ("start_of_week", "week", {"kind": "start_of_quarter"}, ["2024-03-27T10:00:00"]),
        (
            "start_of_day",
            "day",
            {
                "kind": "start_of_day",
                "timezone": "America/New_York",
                "output_format": "%Y-%m-%dT%H%z",
            },
            ["2024-03-10T12:00:00"],
        ),
    ]
    for kind, window, downstream, keys in combos:
        for direction in ("forward", "backward"):
            for tz in ("UTC", "America/New_York", "Europe/Berlin"):
                spec: dict[str, Any] = {
                    "kind": "fan_out",
                    "upstream_mapper": {"kind": kind, "timezone": tz},
                    "window": {"kind": window, "direction": direction},
                }
                if downstream is not None:
                    spec["downstream_mapper"] = downstream
                calls: list[tuple[str, Any]] = [("to_downstream", k) for k in keys]
                calls += [
                    ("queue", [keys[0], 1000]),
                    ("queue", [keys[0], 3]),
                    ("to_downstream", "bad"),
                ]
                down_keys = call(decode_or_none(spec), "to_downstream", keys[0]).get("ok") or []
                calls += [("partition_date", k) for k in down_keys[:2]]
                cases.append(
                    mapper_case(
                        f"fan_out {kind} {window} {direction} {tz} {downstream}", spec, calls
                    )
                )
    cases.append(
        mapper_case(
            "fan_out hour without downstream",
            {
                "kind": "fan_out",
                "upstream_mapper": {"kind": "start_of_hour"},
                "window": {"kind": "hour"},
            },
            [],
        )
    )
    for cap in (5, 7, 40):
        spec = {
            "kind": "fan_out",
            "upstream_mapper": {"kind": "start_of_week"},
            "window": {"kind": "week"},
            "max_downstream_keys": cap,
        }
        calls = [("queue", ["2024-03-13T10:42:15", 1000]), ("queue", ["2024-03-13T10:42:15", 3])]
        cases.append(mapper_case(f"fan_out cap {cap}", spec, calls))
    return cases


def decode_or_none(spec: dict[str, Any]) -> Any:
    try:
        return decode_partition_mapper(encode_partition_mapper(build_mapper(spec)))
    except Exception:
        return None


# --- the cron partition timetable -----------------------------------------------------------


def timetable_spec_from_airflow(encoded: dict[str, Any]) -> dict[str, Any]:
    var = encoded["__var"]
    return {
        "kind": "cron_partition",
        "cron": var["expression"],
        "timezone": var["timezone"],
        "run_offset": var["run_offset"],
        "key_format": var["key_format"],
    }


def timetable_case(name: str, spec: dict[str, Any], calls: list[tuple[str, Any]]) -> dict[str, Any]:
    case: dict[str, Any] = {"name": name, "timetable": spec}
    try:
        kwargs = {"timezone": spec["timezone"]}
        for key in ("run_offset", "key_format"):
            if key in spec:
                kwargs[key] = spec[key]
        encoded = _plain(encode_timetable(sdk.CronPartitionTimetable(spec["cron"], **kwargs)))
    except Exception as exc:
        return case | {"stage": "sdk"} | error(exc)
    case["timetable"] = timetable_spec_from_airflow(encoded)
    core = decode_timetable(encoded)
    out = []
    for op, arg in calls:
        try:
            if op == "partition_info":
                date, key = core._get_partition_info(run_date=pendulum.parse(arg))
                result: dict[str, Any] = {"ok": [iso(date), key]}
            elif op == "iter":
                infos = core.iter_partition_dagrun_infos(
                    earliest=pendulum.parse(arg[0]), latest=pendulum.parse(arg[1])
                )
                result = {"ok": [[iso(i.partition_date), i.partition_key] for i in infos]}
            elif op == "decode":
                result = {"ok": iso(core.resolve_partition_date(arg))}
            else:
                raise AssertionError(op)
        except Exception as exc:
            result = error(exc)
        out.append([op, arg, result])
    case["calls"] = out
    return case


def timetable_cases() -> list[dict[str, Any]]:
    instants = [
        "2024-03-13T00:00:00+00:00",
        "2024-03-13T10:42:15+00:00",
        "2024-03-30T23:00:00+00:00",
        "2024-03-31T00:30:00+00:00",
        "2024-03-31T01:00:00+00:00",
        "2024-03-31T22:00:00+00:00",
        "2024-10-26T22:00:00+00:00",
        "2024-10-27T00:30:00+00:00",
        "2024-10-27T01:00:00+00:00",
        "2024-10-27T23:00:00+00:00",
        "2024-03-10T05:00:00+00:00",
        "2024-03-10T06:30:00+00:00",
        "2024-03-10T07:00:00+00:00",
        "2024-11-03T04:00:00+00:00",
        "2024-11-03T05:30:00+00:00",
        "2024-11-03T06:00:00+00:00",
        "2024-12-31T23:00:00+00:00",
        "2024-02-29T18:30:00+00:00",
    ]
    windows = [
        ["2024-03-29T00:00:00+00:00", "2024-04-02T00:00:00+00:00"],
        ["2024-10-26T00:00:00+00:00", "2024-10-28T00:00:00+00:00"],
        ["2024-03-09T00:00:00+00:00", "2024-03-11T12:00:00+00:00"],
        ["2024-11-02T20:00:00+00:00", "2024-11-03T10:00:00+00:00"],
        ["2024-03-13T05:00:00+00:00", "2024-03-13T05:00:00+00:00"],
        ["2024-03-13T06:00:00+00:00", "2024-03-13T05:00:00+00:00"],
    ]
    specs = []
    for tz in ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"):
        for cron in ("0 0 * * *", "0 * * * *", "30 2 * * *", "0 1 * * 0", "0 0 1 * *"):
            for offset in (0, -1, 2):
                specs.append({"cron": cron, "timezone": tz, "run_offset": offset})
    specs += [
        {"cron": "0 * * * *", "timezone": "America/New_York", "key_format": "%Y-%m-%dT%H:%M:%S%z"},
        {"cron": "0 0 * * *", "timezone": "Europe/Berlin", "key_format": "%Y-%m-%d"},
        {"cron": "@daily", "timezone": "Europe/London", "run_offset": -1, "key_format": "%Y-%m-%d"},
        {"cron": "0 0 * * *", "timezone": "UTC", "run_offset": 1.5},
    ]
    keys = [
        "2024-03-31T00:00:00",
        "2024-03-10T02:30:00",
        "2024-11-03T01:30:00",
        "2024-03-31",
        "bad",
    ]
    cases = []
    for spec in specs:
        calls: list[tuple[str, Any]] = [("partition_info", i) for i in instants]
        calls += [("iter", w) for w in windows] + [("decode", k) for k in keys]
        name = " ".join(
            str(v)
            for v in (
                "cron_partition",
                spec["cron"],
                spec["timezone"],
                spec.get("run_offset"),
                spec.get("key_format"),
            )
        )
        cases.append(timetable_case(name, {"kind": "cron_partition", **spec}, calls))
    return cases


# --- the partitioned asset timetable: which mapper an asset's events take, a key's date -----


def _asset_keys(condition: Any) -> dict[str, list[dict[str, str]]]:
    """The assets and asset references of a (core) condition, in Airflow's iteration order."""
    refs = []
    for ref in condition.iter_asset_refs():
        refs.append({"name": ref.name} if hasattr(ref, "name") else {"uri": ref.uri})
    return {
        "assets": [{"name": k.name, "uri": k.uri} for k, _ in condition.iter_assets()],
        "asset_refs": refs,
    }


def partitioned_case(
    name: str,
    condition: Any,
    config: list[tuple[Any, dict[str, Any]]],
    default: dict[str, Any] | None,
    calls: tuple[list[list[str]], list[str]],
) -> dict[str, Any]:
    """A `PartitionedAssetTimetable(assets=condition, partition_mapper_config=dict(config),
    default_partition_mapper=default)`, SDK -> encode -> decode; its spec lists the condition's
    assets and references and each config entry's, as the decoded timetable iterates them."""
    kwargs: dict[str, Any] = {
        "assets": condition,
        "partition_mapper_config": {asset: build_mapper(m) for asset, m in config},
    }
    if default is not None:
        kwargs["default_partition_mapper"] = build_mapper(default)
    encoded = _plain(encode_timetable(sdk.PartitionedAssetTimetable(**kwargs)))
    core = decode_timetable(encoded)
    return partitioned_case_from_core(name, core, *calls)


def partitioned_case_from_core(
    name: str, core: Any, lookups: list[list[str]], keys: list[str]
) -> dict[str, Any]:
    """The spec and answers of a decoded (core) PartitionedAssetTimetable: the mapper for each
    (name, uri) lookup, and each key's partition date."""

    def mapper_spec(mapper: Any) -> dict[str, Any]:
        return spec_from_airflow(_plain(encode_partition_mapper(mapper)))

    calls = [("mapper_for", k) for k in lookups] + [("partition_date", k) for k in keys]

    spec = {
        "kind": "partitioned_asset",
        **_asset_keys(core.asset_condition),
        "partition_mapper_config": [
            {**_asset_keys(asset), "mapper": mapper_spec(mapper)}
            for asset, mapper in core.partition_mapper_config.items()
        ],
        "default_partition_mapper": mapper_spec(core.default_partition_mapper),
    }
    out = []
    for op, arg in calls:
        try:
            if op == "mapper_for":
                mapper = core.get_partition_mapper(name=arg[0], uri=arg[1])
                result: dict[str, Any] = {"ok": mapper_spec(mapper)}
            elif op == "partition_date":
                result = {"ok": iso(core.resolve_partition_date(arg))}
            else:
                raise AssertionError(op)
        except Exception as exc:
            result = error(exc)
        out.append([op, arg, result])
    return {"name": name, "timetable": spec, "calls": out}


def partitioned_cases() -> list[dict[str, Any]]:
    a = sdk.Asset(name="a", uri="s3://bucket/a")
    b = sdk.Asset(name="b", uri="s3://bucket/b")
    c = sdk.Asset(name="c", uri="s3://bucket/c")
    by_name = sdk.Asset.ref(name="ref")
    by_uri = sdk.Asset.ref(uri="s3://bucket/d")
    day = {"kind": "start_of_day"}
    day_ny = {"kind": "start_of_day", "timezone": "America/New_York"}
    hour = {"kind": "start_of_hour"}
    rollup = {
        "kind": "rollup",
        "upstream_mapper": {"kind": "start_of_day", "input_format": "%Y-%m-%dT%H"},
        "window": {"kind": "day"},
    }
    product = {"kind": "product", "mappers": [day, {"kind": "identity"}]}
    lookups = [
        ["a", "s3://bucket/a"],
        ["b", "s3://bucket/b"],
        ["c", "s3://bucket/c"],
        ["ref", ""],
        ["", "s3://bucket/d"],
        ["d", "s3://bucket/d"],
        ["x", "s3://bucket/a"],
        ["", "s3://bucket/a"],
        ["", ""],
    ]
    keys = ["2024-03-13", "2024-03-13T10", "2024-11-03", "2024-03-13|us", "x", ""]
    calls = (lookups, keys)
    table: list[tuple[str, Any, list[tuple[Any, dict[str, Any]]], dict[str, Any] | None]] = [
        ("identity by default", a & b, [], None),
        ("one day mapper", a & b, [(a, day)], None),
        ("day mappers agree", a & b, [(a, day), (b, day)], None),
        ("day mappers disagree on the zone", a & b, [(a, day), (b, day_ny)], None),
        ("default day, b by hour", a | b | c, [(b, hour)], day),
        (
            "refs by name and by uri",
            (a & b) | by_name | by_uri,
            [(a, day), (by_name, day), (by_uri, hour)],
            None,
        ),
        # (a group such as `b & c` as a key fails Airflow's decode: unhashable SerializedAssetAll)
        ("a later name ref overrides", a & b, [(a, hour), (sdk.Asset.ref(name="a"), day)], None),
        ("rollup and product", a & b, [(a, rollup), (b, product)], None),
    ]
    return [
        partitioned_case(name, cond, config, default, calls)
        for name, cond, config, default in table
    ]


# --- the partition example Dags shipped with Airflow (airflow/example_dags/) ----------------

EXAMPLE_FILE = "example_asset_partition.py"
EXAMPLE_KEYS = [
    "2024-03-13T10:00:00",
    "2024-03-10T02:00:00",
    "2024-11-03T01:00:00",
    "2024-03-13",
    "2024-03-31",
    "2024-03",
    "us",
    "eu",
    "apac",
    "xx",
    "us|2024-03-13T10:00:00",
    "2024-03-13T10:00:00|us",
    "",
]


def example_dags() -> list[Any]:
    """The Dags of Airflow's partition example file, bagged as the dag-processor bags them."""
    import os
    import shutil
    import tempfile

    import airflow.example_dags
    from airflow.dag_processing.dagbag import BundleDagBag

    source = Path(airflow.example_dags.__file__).parent / EXAMPLE_FILE
    folder = Path(tempfile.mkdtemp(prefix="partition-examples-"))
    try:
        shutil.copy(source, folder / EXAMPLE_FILE)
        os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder)
        assert not bag.import_errors, bag.import_errors
        return [bag.dags[dag_id] for dag_id in sorted(bag.dags)]
    finally:
        shutil.rmtree(folder)


def example_calls(core: Any) -> list[tuple[str, Any]]:
    """Airflow's own answers pick the follow-up calls: each queued key's partition date, and
    for a rollup what it waits for and whether half of it is enough."""
    calls: list[tuple[str, Any]] = [("keys", k) for k in EXAMPLE_KEYS]
    downstream: list[str] = []
    for key in EXAMPLE_KEYS:
        for found in call(core, "keys", key).get("ok", []):
            if found not in downstream:
                downstream.append(found)
    for key in downstream[:4]:
        calls.append(("partition_date", key))
        if core.is_rollup:
            calls.append(("to_upstream", key))
            expected = sorted(core.to_upstream(key))
            calls.append(("satisfied", [key, expected[: len(expected) // 2]]))
            calls.append(("satisfied", [key, expected]))
    return calls


def example_cases() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(mapper cases, timetable cases) from the example Dags: every partitioned asset Dag's
    timetable (its mapper per asset, its partition dates) and each distinct mapper it uses;
    every cron partition Dag's keys."""
    mappers: list[dict[str, Any]] = []
    timetables: list[dict[str, Any]] = []
    seen: set[str] = set()
    instants = [
        "2024-03-13T10:00:00+00:00",
        "2024-03-10T07:15:00+00:00",
        "2024-03-11T00:00:00+00:00",
    ]
    for dag in example_dags():
        name = f"example {dag.dag_id}"
        kind = type(dag.timetable).__name__
        encoded = _plain(encode_timetable(dag.timetable))
        if kind == "CronPartitionTimetable":
            var = encoded["__var"]
            spec = {
                "kind": "cron_partition",
                "cron": var["expression"],
                "timezone": var["timezone"],
                "run_offset": var["run_offset"],
                "key_format": var["key_format"],
            }
            calls = [("partition_info", i) for i in instants] + [
                ("iter", ["2024-03-10T00:00:00+00:00", "2024-03-11T03:00:00+00:00"]),
                ("decode", "2024-03-13T10:00:00"),
            ]
            timetables.append(timetable_case(name, spec, calls))
            continue
        if kind != "PartitionedAssetTimetable":
            continue  # PartitionedAtRuntime: keys come from the task, no arithmetic
        core = decode_timetable(encoded)
        lookups = [[k.name, k.uri] for k, _ in core.asset_condition.iter_assets()]
        lookups += [
            [getattr(r, "name", ""), getattr(r, "uri", "")]
            for r in core.asset_condition.iter_asset_refs()
        ]
        case = partitioned_case_from_core(name, core, lookups, EXAMPLE_KEYS[:6])
        timetables.append(case)
        for lookup in lookups:
            mapper = core.get_partition_mapper(name=lookup[0], uri=lookup[1])
            spec = spec_from_airflow(_plain(encode_partition_mapper(mapper)))
            text = json.dumps(spec, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            mappers.append(
                {
                    "name": f"{name} {lookup[0] or lookup[1]}",
                    "mapper": spec,
                    "calls": [
                        [op, arg, call(mapper, op, arg)] for op, arg in example_calls(mapper)
                    ],
                }
            )
    return mappers, timetables


def corpus() -> dict[str, Any]:
    mappers = (
        temporal_cases() + simple_cases() + composite_cases() + rollup_cases() + fan_out_cases()
    )
    example_mappers, example_timetables = example_cases()
    return {
        "airflow": _airflow_version(),
        "mappers": mappers + example_mappers,
        "timetables": timetable_cases() + partitioned_cases() + example_timetables,
    }


def _airflow_version() -> str:
    from importlib.metadata import version

    return version("apache-airflow-core")


def dumps(data: dict[str, Any]) -> str:
    """Sorted JSON, one case a line (a regenerated corpus diffs case by case)."""

    def line(value: Any) -> str:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)

    parts = [f' "airflow": {line(data["airflow"])}']
    for section in ("mappers", "timetables"):
        rows = ",\n  ".join(line(case) for case in data[section])
        parts.append(f' "{section}": [\n  {rows}\n ]')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)}")
    parser.add_argument("--output", type=Path, help="write the corpus to this file instead")
    args = parser.parse_args()
    # CronPartitionTimetable logs every offset it applies (info, on stdout): keep the output clean
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    text = dumps(corpus())
    target = args.output or (GOLDEN if args.write else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
