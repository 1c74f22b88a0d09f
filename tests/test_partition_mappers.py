"""The golden partition corpus (issue 43's first acceptance item): our partition mappers and
cron partition timetable give Airflow 3.3.2's own answers, 0 differences.

`tests/data/partitions/golden.json` was written by `tools/partition_golden.py` with the pinned
Airflow (its docstring says what a case holds; `tests/compat/test_partition_golden.py` checks it
is still what Airflow says). Here each case is replayed through
`assets_app.definitions.partitions` from the same definition form, and every answer (or
exception class and message) compared with Airflow's. No database: pure computation.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from assets_app.definitions import partitions as p

GOLDEN = Path(__file__).parent / "data" / "partitions" / "golden.json"


@cache
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def outcome(fn: Any) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except Exception as exc:  # every exception is part of the answer compared
        return {"error": [type(exc).__name__, str(exc)]}


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def mapper_call(mapper: p.Mapper, op: str, arg: Any) -> dict[str, Any]:
    if op == "to_downstream":
        return outcome(lambda: mapper.to_downstream(arg))
    if op == "queue":
        return outcome(lambda: p.queue_keys(mapper, arg[0], global_cap=arg[1]))
    if op == "keys":  # the corpus sorts these: a segment fan-out's order is a frozenset's
        return outcome(lambda: sorted(p.queue_keys(mapper, arg)))
    if op == "to_upstream":
        assert isinstance(mapper, p.RollupMapper)
        return outcome(lambda: sorted(mapper.to_upstream(arg)))
    if op == "partition_date":
        return outcome(lambda: iso(mapper.to_partition_date(arg)))
    if op == "satisfied":
        assert isinstance(mapper, p.RollupMapper)

        def satisfied() -> list[Any]:
            s = mapper.satisfaction(arg[0], matched=arg[1])
            return [s.satisfied, s.unreachable, s.unreachable_reason]

        return outcome(satisfied)
    raise AssertionError(op)


def build_timetable(spec: dict[str, Any]) -> Any:
    if spec["kind"] == "partitioned_asset":
        return p.PartitionedAssetTimetable.from_spec(spec)
    return p.CronPartitionTimetable.from_spec(spec)


def timetable_call(timetable: Any, op: str, arg: Any) -> dict[str, Any]:
    def parse(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text)

    if op == "mapper_for":
        return outcome(lambda: timetable.mapper_for(name=arg[0], uri=arg[1]).spec())
    if op == "partition_date":
        return outcome(lambda: iso(timetable.resolve_partition_date(arg)))

    if op == "partition_info":
        return outcome(lambda: [iso((part := timetable.partition(parse(arg))).date), part.key])
    if op == "iter":
        return outcome(
            lambda: [
                [iso(part.date), part.key]
                for part in timetable.partitions(earliest=parse(arg[0]), latest=parse(arg[1]))
            ]
        )
    if op == "decode":
        return outcome(lambda: iso(timetable.resolve_partition_date(arg)))
    raise AssertionError(op)


def differences(case: dict[str, Any], build: Any, call: Any, spec_key: str) -> tuple[int, list]:
    """(cases compared, differences) for one golden case: the construction, then each call."""
    built = outcome(lambda: build(case[spec_key]))
    if "error" in case:
        return 1, [] if built.get("error") == case["error"] else [
            ("construct", case["error"], built)
        ]
    if "error" in built:
        return len(case["calls"]), [("construct", None, built)]
    thing = built["ok"]
    diffs = []
    if thing.spec() != case[spec_key]:
        diffs.append(("spec", case[spec_key], thing.spec()))
    for op, arg, expected in case["calls"]:
        got = call(thing, op, arg)
        if got != expected:
            diffs.append((op, arg, expected, got))
    return len(case["calls"]), diffs


def test_golden_corpus_is_pinned_airflow() -> None:
    corpus = golden()
    assert corpus["airflow"] == "3.3.2"
    kinds = {c["mapper"]["kind"] for c in corpus["mappers"]}
    assert kinds >= {
        "identity",
        "allowed_key",
        "fixed_key",
        "product",
        "chain",
        "rollup",
        "fan_out",
    }
    assert kinds >= set(p.TEMPORAL)
    assert {c["timetable"]["kind"] for c in corpus["timetables"]} == {
        "cron_partition",
        "partitioned_asset",
    }


@pytest.mark.parametrize("section", ["mappers", "timetables"])
def test_golden_partition_arithmetic_equals_airflow(section: str) -> None:
    build, call, spec_key = (
        (p.mapper_from_spec, mapper_call, "mapper")
        if section == "mappers"
        else (build_timetable, timetable_call, "timetable")
    )
    compared = 0
    found: list[tuple[str, Any]] = []
    for case in golden()[section]:
        count, diffs = differences(case, build, call, spec_key)
        compared += count
        found.extend((case["name"], d) for d in diffs)
    print(f"{section}: {compared} golden cases, {len(found)} differences")
    assert compared > 500
    assert not found, "\n".join(f"{name}: {d}"[:600] for name, d in found[:20])


def test_wait_policy_and_cap_refusals_are_read_from_the_spec() -> None:
    """The shapes the worker's conversion will carry: a malformed document is refused with a
    PartitionSpecError naming it (not an Airflow error: Airflow never sees such a document)."""
    for spec in (
        {"kind": "nope"},
        {"kind": "chain", "mappers": [{"kind": "identity"}]},
        {"kind": "rollup", "upstream_mapper": {"kind": "start_of_day"}, "window": {"kind": "moon"}},
        {
            "kind": "rollup",
            "upstream_mapper": {"kind": "start_of_day"},
            "window": {"kind": "day"},
            "wait_policy": {"kind": "minimum_count"},
        },
    ):
        with pytest.raises(p.PartitionSpecError):
            p.mapper_from_spec(spec)
