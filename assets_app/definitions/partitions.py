"""Partition key arithmetic (AIP-76): Airflow 3.3.2's partition mappers and the cron partition
timetable's keys, as pure computation (no Airflow import, no database).

A partitioned Dag (Airflow's `PartitionedAssetTimetable`) maps each upstream asset event's
partition key to the key(s) of the run(s) it feeds through a *mapper*; a rollup mapper also
says which upstream keys one downstream key waits for, and its *wait policy* when that wait is
over. `CronPartitionTimetable` gives each scheduled run a partition key formatted from its date.
This module answers those questions exactly as Airflow's own code does, read from:

- airflow/partition_mappers/{base,identity,allowed_key,fixed_key,product,chain,temporal,
  window,wait_policy}.py (the core classes the scheduler calls after decoding the serialized
  Dag; the Task SDK's `airflow/sdk/definitions/partition_mappers/` classes the Dag file builds
  carry the same parameters and parse-time checks);
- airflow/assets/manager.py `_queue_partitioned_dags` (how many downstream keys one event may
  queue: the mapper's `max_downstream_keys`, else `[scheduler]
  partition_mapper_max_downstream_keys`, default 1000);
- airflow/jobs/scheduler_job_runner.py `_resolve_asset_partition_status` (a rollup's
  `wait_policy.is_satisfied_by_keys(matched, expected=to_upstream(key))`);
- airflow/timetables/simple.py `PartitionedAssetTimetable` (`get_partition_mapper`, which
  mapper an asset's events take; `_decode_partition_date`, a run key's partition date);
- airflow/timetables/trigger.py `CronPartitionTimetable` (`_get_partition_info`,
  `iter_partition_dagrun_infos`, `_decode_partition_date`) and airflow/_shared/timezones/
  timezone.py `make_aware` with pendulum 3's `Timezone.convert` (how a naive wall time gets its
  zone: a skipped time moves forward by the gap, a repeated one takes its second occurrence).

`tests/data/partitions/golden.json`, written by `tools/partition_golden.py` with the pinned
Airflow, holds Airflow's answers (and its exceptions, class and message) for every mapper and
for the timetable, DST days included; `tests/test_partition_mappers.py` checks this module gives
the same, 0 differences.

A mapper travels as JSON, the definition form `mapper_from_spec` reads and `Mapper.spec`
writes (one-to-one with Airflow's `encode_partition_mapper` output, every default filled in):

    {"kind": "identity"}
    {"kind": "allowed_key", "allowed_keys": ["us", "eu"]}
    {"kind": "fixed_key", "downstream_key": "all"}
    {"kind": "start_of_hour" | "start_of_day" | "start_of_week" | "start_of_month"
             | "start_of_quarter" | "start_of_year",
     "timezone": "Europe/Berlin" (an IANA name, "UTC", or a fixed offset in seconds),
     "input_format": "%Y-%m-%dT%H:%M:%S", "output_format": "%Y-%m-%d"}
    {"kind": "product", "delimiter": "|", "mappers": [<mapper>, <mapper>, ...]}
    {"kind": "chain", "mappers": [<mapper>, <mapper>, ...]}
    {"kind": "rollup", "upstream_mapper": <mapper>, "window": <window>,
     "wait_policy": {"kind": "wait_for_all"} | {"kind": "minimum_count", "n": -2}}
    {"kind": "fan_out", "upstream_mapper": <mapper>, "window": <window>,
     "downstream_mapper": <mapper>}
    <window>: {"kind": "hour" | "day" | "week" | "month" | "quarter" | "year",
               "direction": "forward" | "backward"} | {"kind": "segment", "segments": [...]}

and any mapper may carry "max_downstream_keys": n. The cron partition timetable is
{"kind": "cron_partition", "cron", "timezone", "run_offset", "key_format"}, the partitioned
asset timetable {"kind": "partitioned_asset", "assets": [{"name", "uri"}], "asset_refs":
[{"name"} | {"uri"}], "partition_mapper_config": [{"assets", "asset_refs", "mapper"}],
"default_partition_mapper": <mapper>} (the condition's assets and references in Airflow's
iteration order; the condition itself stays in the Dag's `schedule`).

Airflow's behaviour is kept where it surprises, because a Dag must mean the same here: a
`DayWindow` is 24 naive hourly steps, so on a spring-forward day the skipped hour's key is
the next hour's (23 distinct keys) and on a fall-back day the repeated hour is not waited for;
a chain keeps duplicate keys; a fan-out's downstream mapper formats without converting zones.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from assets_app.definitions.timetables import _Cron

UTC = dt.UTC
DEFAULT_MAX_DOWNSTREAM_KEYS = 1000  # [scheduler] partition_mapper_max_downstream_keys
DEFAULT_INPUT_FORMAT = "%Y-%m-%dT%H:%M:%S"


class PartitionSpecError(ValueError):
    """A mapper or timetable definition the service cannot read (not an Airflow error)."""


class InvalidTimezone(ValueError):
    """An unknown zone name (pendulum's `InvalidTimezone`: the message is the name)."""


class InvalidPartitionKeyError(ValueError):
    """A key that does not match a cron partition timetable's key format (Airflow's)."""


class FanOutExceeded(ValueError):
    """One event mapped to more downstream keys than the cap allows: Airflow queues none of
    them and logs "partition fan-out exceeded" (the message is its log line's)."""


# --- time zones, as Airflow's pendulum ones behave ------------------------------------------


def parse_zone(value: str | int) -> dt.tzinfo:
    """`airflow._shared.timezones.timezone.parse_timezone`: "UTC" (any case) is a fixed zero
    offset named UTC, an int a fixed offset in seconds (named "+05:30"), else an IANA zone."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PartitionSpecError(f"time zone {value!r} must be a name or an offset in seconds")
    if isinstance(value, int):
        sign = "-" if value < 0 else "+"
        hour, minute = divmod(abs(int(value / 60)), 60)
        return dt.timezone(dt.timedelta(seconds=value), f"{sign}{hour:02d}:{minute:02d}")
    if value.lower() == "utc":
        return dt.timezone(dt.timedelta(0), "UTC")
    try:
        return ZoneInfo(value)
    except ZoneInfoNotFoundError:
        raise InvalidTimezone(value) from None


def make_aware(value: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """Airflow's `make_aware` (fold=1, then pendulum's `convert`): a wall time the clock skips
    moves forward by the gap; a repeated one keeps fold=1, its second occurrence."""
    if value.tzinfo is not None and value.tzinfo.utcoffset(value) is not None:
        raise ValueError(f"make_aware expects a naive datetime, got {value}")
    value = value.replace(fold=1)
    if not isinstance(tz, ZoneInfo):  # pendulum's FixedTimezone.convert
        return value.replace(tzinfo=tz, fold=0)
    before = cast(dt.timedelta, tz.utcoffset(value.replace(fold=0)))
    after = cast(dt.timedelta, tz.utcoffset(value))
    if after > before:
        value = value + (after - before)
    return value.replace(tzinfo=tz)


def zone_spec(tz: dt.tzinfo) -> str | int:
    """The zone as the definition carries it (Airflow's `encode_timezone`)."""
    if isinstance(tz, ZoneInfo):
        return tz.key
    offset = cast(dt.timedelta, tz.utcoffset(None))
    return "UTC" if not offset else int(offset.total_seconds())


def _check_cap(value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"max_downstream_keys must be a positive integer or None, got {value!r}")
    return value


# --- windows (airflow/partition_mappers/window.py) ------------------------------------------


class Window:
    """Which decoded upstream items make up one decoded downstream period."""

    airflow_name: ClassVar[str]
    kind: ClassVar[str]
    decodes_to: ClassVar[type] = dt.datetime

    def __init__(self, *, direction: str = "forward") -> None:
        if direction not in ("forward", "backward"):
            raise PartitionSpecError(f"window direction {direction!r} is not forward or backward")
        self.backward = direction == "backward"

    def to_upstream(self, anchor: Any) -> Iterable[Any]:
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "direction": "backward" if self.backward else "forward"}

    def _steps(self, anchor: Any, count: int, step: Any) -> Iterator[Any]:
        """`_build_directional_steps`: `count` period starts from the anchor, or ending at it."""
        base = step(anchor, -(count - 1)) if self.backward else anchor
        return (step(base, i) for i in range(count))


def _require_day_one(value: dt.datetime, window: Window) -> None:
    if value.day != 1:
        raise ValueError(
            f"{window.airflow_name} expects a period start on day 1 of the month, "
            f"got {value.isoformat()}. The paired upstream mapper's decode_downstream "
            "must normalise to day 1."
        )


def _shift_months(value: dt.datetime, months: int) -> dt.datetime:
    total = value.month - 1 + months
    return value.replace(year=value.year + total // 12, month=total % 12 + 1)


class HourWindow(Window):
    airflow_name = "HourWindow"
    kind = "hour"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        return self._steps(anchor, 60, lambda s, i: s + dt.timedelta(minutes=i))


class DayWindow(Window):
    """24 naive hourly steps, whatever the local day's length (Airflow's DST caveat)."""

    airflow_name = "DayWindow"
    kind = "day"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        return self._steps(anchor, 24, lambda s, i: s + dt.timedelta(hours=i))


class WeekWindow(Window):
    airflow_name = "WeekWindow"
    kind = "week"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        return self._steps(anchor, 7, lambda s, i: s + dt.timedelta(days=i))


class MonthWindow(Window):
    """Every day of the anchor's month; backward, the days after the previous month's 1st up
    to and including the anchor (not a calendar month)."""

    airflow_name = "MonthWindow"
    kind = "month"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        _require_day_one(anchor, self)
        if self.backward:
            prev = _shift_months(anchor, -1)
            return (prev + dt.timedelta(days=i + 1) for i in range((anchor - prev).days))
        days = (_shift_months(anchor, 1) - anchor).days
        return (anchor + dt.timedelta(days=i) for i in range(days))


class QuarterWindow(Window):
    airflow_name = "QuarterWindow"
    kind = "quarter"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        _require_day_one(anchor, self)
        return self._steps(anchor, 3, _shift_months)


class YearWindow(Window):
    airflow_name = "YearWindow"
    kind = "year"

    def to_upstream(self, anchor: dt.datetime) -> Iterable[dt.datetime]:
        _require_day_one(anchor, self)
        return self._steps(anchor, 12, _shift_months)


class SegmentWindow(Window):
    """A fixed set of categorical keys, whatever the anchor."""

    airflow_name = "SegmentWindow"
    kind = "segment"
    decodes_to = str

    def __init__(self, segments: Iterable[Any]) -> None:
        super().__init__()
        validated: list[str] = []
        for i, item in enumerate(segments):
            if not isinstance(item, str):
                raise ValueError(
                    "SegmentWindow segment keys must be str; got "
                    f"{type(item).__name__!r} at index {i}: {item!r}"
                )
            if not item:
                raise ValueError(
                    "SegmentWindow segment keys must be non-empty; got an empty string at "
                    f"index {i}."
                )
            validated.append(item)
        if not validated:
            raise ValueError(
                "SegmentWindow requires at least one segment key; got an empty iterable."
            )
        self.segments = frozenset(validated)

    def to_upstream(self, anchor: Any) -> frozenset[str]:
        return self.segments

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "segments": sorted(self.segments)}


WINDOWS: dict[str, type[Window]] = {
    w.kind: w for w in (HourWindow, DayWindow, WeekWindow, MonthWindow, QuarterWindow, YearWindow)
}


# --- wait policies (airflow/partition_mappers/wait_policy.py) -------------------------------


@dataclass(frozen=True)
class Satisfaction:
    """Airflow's `PartitionSatisfaction`."""

    satisfied: bool
    unreachable: bool
    unreachable_reason: str | None


class WaitForAll:
    """Fires when every expected upstream key has arrived."""

    def is_satisfied_by_keys(self, *, matched: set[str], expected: frozenset[str]) -> Satisfaction:
        return Satisfaction(expected <= matched, False, None)

    def spec(self) -> dict[str, Any]:
        return {"kind": "wait_for_all"}


class MinimumCount:
    """Fires once `n` expected keys arrived (n > 0), or once at most -n are missing (n < 0)."""

    def __init__(self, n: int) -> None:
        if n == 0:
            raise ValueError(
                "MinimumCount(0) is degenerate: n=0 would always fire, even on empty windows. "
                "Use WaitForAll() to require every key, or MinimumCount(n) with n != 0."
            )
        self.n = n

    def __repr__(self) -> str:
        return f"MinimumCount(n={self.n!r})"

    def is_satisfied_by_keys(self, *, matched: set[str], expected: frozenset[str]) -> Satisfaction:
        cardinality = len(expected)
        count = len(matched & expected)
        satisfied = count >= self.n if self.n > 0 else count >= max(0, cardinality + self.n)
        unreachable = self.n > 0 and self.n > cardinality
        reason = (
            f"wait policy {self!r} can never be satisfied given the window's cardinality "
            f"{cardinality}"
            if unreachable
            else None
        )
        return Satisfaction(satisfied, unreachable, reason)

    def spec(self) -> dict[str, Any]:
        return {"kind": "minimum_count", "n": self.n}


WaitPolicy = WaitForAll | MinimumCount


# --- mappers ------------------------------------------------------------------------------


class Mapper:
    """Airflow's `PartitionMapper` (airflow/partition_mappers/base.py): maps an upstream event's
    partition key to the target Dag's run key(s)."""

    kind: ClassVar[str]
    airflow_name: ClassVar[str]
    is_rollup: ClassVar[bool] = False
    decodes_to: ClassVar[type] = str

    def __init__(self, *, max_downstream_keys: int | None = None) -> None:
        self.max_downstream_keys = _check_cap(max_downstream_keys)

    def to_downstream(self, key: str) -> str | list[str]:
        raise NotImplementedError

    def decode_downstream(self, key: str) -> Any:
        return key

    def encode_upstream(self, decoded: Any) -> str:
        return cast(str, decoded)

    def to_partition_date(self, key: str) -> dt.datetime | None:
        """The run's `partition_date` for a downstream key (None: the key is not a time)."""
        return None

    def carry_partition_date(self, source: dt.datetime | None) -> dt.datetime | None:
        """The producer run's `partition_date` carried onto the consumer's (identity only)."""
        return None

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, **self._fields()} | self._cap()

    def _fields(self) -> dict[str, Any]:
        return {}

    def _cap(self) -> dict[str, Any]:
        cap = self.max_downstream_keys
        return {} if cap is None else {"max_downstream_keys": cap}


class IdentityMapper(Mapper):
    kind = "identity"
    airflow_name = "IdentityMapper"

    def to_downstream(self, key: str) -> str:
        return key

    def carry_partition_date(self, source: dt.datetime | None) -> dt.datetime | None:
        return source


class AllowedKeyMapper(Mapper):
    kind = "allowed_key"
    airflow_name = "AllowedKeyMapper"

    def __init__(self, allowed_keys: list[str], *, max_downstream_keys: int | None = None) -> None:
        super().__init__(max_downstream_keys=max_downstream_keys)
        self.allowed_keys = list(allowed_keys)

    def to_downstream(self, key: str) -> str:
        if key not in self.allowed_keys:
            raise ValueError(f"Key {key!r} not in allowed keys {self.allowed_keys}")
        return key

    def _fields(self) -> dict[str, Any]:
        return {"allowed_keys": list(self.allowed_keys)}


class FixedKeyMapper(Mapper):
    kind = "fixed_key"
    airflow_name = "FixedKeyMapper"

    def __init__(self, downstream_key: str, *, max_downstream_keys: int | None = None) -> None:
        super().__init__(max_downstream_keys=max_downstream_keys)
        if not downstream_key or not isinstance(downstream_key, str):
            raise ValueError(
                f"FixedKeyMapper downstream_key must be a non-empty str; got {downstream_key!r}."
            )
        self.downstream_key = downstream_key

    def to_downstream(self, key: str) -> str:
        return self.downstream_key

    def _fields(self) -> dict[str, Any]:
        return {"downstream_key": self.downstream_key}


_STRPTIME_PATTERNS = {
    "%Y": r"\d{4}",
    **{d: r"\d{2}" for d in ("%m", "%d", "%H", "%M", "%S", "%V", "%U", "%W")},
}


def _compile_output_format_regex(
    fmt: str, placeholder_patterns: Mapping[str, str] | None = None
) -> re.Pattern[str]:
    """airflow/partition_mappers/temporal.py `_compile_output_format_regex`, line for line: a
    strftime directive of `_STRPTIME_PATTERNS` or a `{name}` placeholder becomes a named
    group, anything else a literal; malformed formats raise its ValueErrors."""
    placeholder_patterns = placeholder_patterns or {}
    parts: list[str] = []
    seen_groups: set[str] = set()
    prev_was_default_placeholder = False
    i = 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt) and fmt[i : i + 2] in _STRPTIME_PATTERNS:
            directive = fmt[i : i + 2]
            name = directive[1]
            if name in seen_groups:
                raise ValueError(
                    f"output_format {fmt!r} reuses directive {directive!r}; "
                    "each strftime directive may appear at most once."
                )
            seen_groups.add(name)
            parts.append(f"(?P<{name}>{_STRPTIME_PATTERNS[directive]})")
            i += 2
            prev_was_default_placeholder = False
            continue
        if fmt[i] == "{":
            end = fmt.find("}", i)
            if end != -1:
                name = fmt[i + 1 : end]
                if not name.isidentifier():
                    raise ValueError(
                        f"output_format {fmt!r} has invalid placeholder {{{name}}}; "
                        "placeholder names must be valid Python identifiers."
                    )
                if name in seen_groups:
                    raise ValueError(
                        f"output_format {fmt!r} reuses placeholder {{{name}}}; "
                        "each placeholder may appear at most once."
                    )
                seen_groups.add(name)
                is_default = name not in placeholder_patterns
                if is_default and prev_was_default_placeholder:
                    raise ValueError(
                        f"output_format {fmt!r} has adjacent default-pattern placeholders "
                        f"ending at {{{name}}}; the greedy ``\\w+`` default would consume "
                        "the previous group's tail. Insert a separator between the "
                        "placeholders, or narrow at least one of them via placeholder_patterns."
                    )
                pattern = placeholder_patterns.get(name, r"\w+")
                parts.append(f"(?P<{name}>{pattern})")
                i = end + 1
                prev_was_default_placeholder = is_default
                continue
        parts.append(re.escape(fmt[i]))
        i += 1
        prev_was_default_placeholder = False
    return re.compile(f"^{''.join(parts)}$")


class TemporalMapper(Mapper):
    """`_BaseTemporalMapper`: parse the key (`input_format`, naive keys are wall times in the
    mapper's zone, aware ones are converted to it), normalise to the period start, format
    (`output_format`). Decoding reads a downstream key back as a naive period start."""

    decodes_to = dt.datetime
    default_output_format: ClassVar[str]

    def __init__(
        self,
        *,
        timezone: str | int = "UTC",
        input_format: str = DEFAULT_INPUT_FORMAT,
        output_format: str | None = None,
        max_downstream_keys: int | None = None,
    ) -> None:
        self.tz = parse_zone(timezone)
        super().__init__(max_downstream_keys=max_downstream_keys)
        self.input_format = input_format
        self.output_format = output_format or self.default_output_format

    def normalize(self, value: dt.datetime) -> dt.datetime:
        raise NotImplementedError

    def to_downstream(self, key: str) -> str:
        parsed = dt.datetime.strptime(key, self.input_format)
        if parsed.tzinfo is None:
            parsed = make_aware(parsed, self.tz)
        else:
            parsed = parsed.astimezone(self.tz)
        return self.format(self.normalize(parsed))

    def format(self, value: dt.datetime) -> str:
        return value.strftime(self.output_format)

    def decode_downstream(self, key: str) -> dt.datetime:
        return dt.datetime.strptime(key, self.output_format)

    def to_partition_date(self, key: str) -> dt.datetime:
        anchor = self.normalize(self.decode_downstream(key))
        return make_aware(anchor, self.tz) if anchor.tzinfo is None else anchor

    def encode_upstream(self, decoded: dt.datetime) -> str:
        naive = decoded
        if decoded.tzinfo is not None:
            naive = decoded.astimezone(self.tz).replace(tzinfo=None)
        return make_aware(naive, self.tz).strftime(self.input_format)

    def _fields(self) -> dict[str, Any]:
        return {
            "timezone": zone_spec(self.tz),
            "input_format": self.input_format,
            "output_format": self.output_format,
        }


class StartOfHourMapper(TemporalMapper):
    kind = "start_of_hour"
    airflow_name = "StartOfHourMapper"
    default_output_format = "%Y-%m-%dT%H"

    def normalize(self, value: dt.datetime) -> dt.datetime:
        return value.replace(minute=0, second=0, microsecond=0)


class StartOfDayMapper(TemporalMapper):
    kind = "start_of_day"
    airflow_name = "StartOfDayMapper"
    default_output_format = "%Y-%m-%d"

    def normalize(self, value: dt.datetime) -> dt.datetime:
        return value.replace(hour=0, minute=0, second=0, microsecond=0)


class StartOfWeekMapper(TemporalMapper):
    """The Monday of the ISO week; its key is read back through `%Y`, `%m` and `%d`."""

    kind = "start_of_week"
    airflow_name = "StartOfWeekMapper"
    default_output_format = "%Y-%m-%d (W%V)"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_pattern = _compile_output_format_regex(self.output_format)

    def normalize(self, value: dt.datetime) -> dt.datetime:
        start = value - dt.timedelta(days=value.weekday())
        return start.replace(hour=0, minute=0, second=0, microsecond=0)

    def decode_downstream(self, key: str) -> dt.datetime:
        match = self._key_pattern.search(key)
        if match is None or not {"Y", "m", "d"}.issubset(match.groupdict()):
            raise ValueError(
                f"StartOfWeekMapper.decode_downstream could not parse {key!r} "
                f"with output_format {self.output_format!r}; "
                "output_format must include the %Y, %m and %d directives."
            )
        return dt.datetime(int(match["Y"]), int(match["m"]), int(match["d"]))


class StartOfMonthMapper(TemporalMapper):
    kind = "start_of_month"
    airflow_name = "StartOfMonthMapper"
    default_output_format = "%Y-%m"

    def normalize(self, value: dt.datetime) -> dt.datetime:
        return value.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


class StartOfQuarterMapper(TemporalMapper):
    """The quarter's first day; `{quarter}` in the output format is its number, 1 to 4."""

    kind = "start_of_quarter"
    airflow_name = "StartOfQuarterMapper"
    default_output_format = "%Y-Q{quarter}"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_pattern = _compile_output_format_regex(self.output_format, {"quarter": r"[1-4]"})

    def normalize(self, value: dt.datetime) -> dt.datetime:
        month = (value.month - 1) // 3 * 3 + 1
        return value.replace(month=month, day=1, hour=0, minute=0, second=0, microsecond=0)

    def format(self, value: dt.datetime) -> str:
        return value.strftime(self.output_format).format(quarter=(value.month - 1) // 3 + 1)

    def decode_downstream(self, key: str) -> dt.datetime:
        match = self._key_pattern.search(key)
        if match is None or not {"Y", "quarter"}.issubset(match.groupdict()):
            raise ValueError(
                f"StartOfQuarterMapper.decode_downstream could not parse {key!r} "
                f"with output_format {self.output_format!r}; "
                "output_format must include the %Y directive and the {quarter} placeholder."
            )
        return dt.datetime(int(match["Y"]), (int(match["quarter"]) - 1) * 3 + 1, 1)


class StartOfYearMapper(TemporalMapper):
    kind = "start_of_year"
    airflow_name = "StartOfYearMapper"
    default_output_format = "%Y"

    def normalize(self, value: dt.datetime) -> dt.datetime:
        return value.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)


TEMPORAL: dict[str, type[TemporalMapper]] = {
    m.kind: m
    for m in (
        StartOfHourMapper,
        StartOfDayMapper,
        StartOfWeekMapper,
        StartOfMonthMapper,
        StartOfQuarterMapper,
        StartOfYearMapper,
    )
}


class ProductMapper(Mapper):
    """A multi-part key (`delimiter`-separated), each part mapped by its own mapper."""

    kind = "product"
    airflow_name = "ProductMapper"

    def __init__(
        self, mappers: list[Mapper], *, delimiter: str = "|", max_downstream_keys: int | None = None
    ) -> None:
        super().__init__(max_downstream_keys=max_downstream_keys)
        self.mappers = mappers
        self.delimiter = delimiter

    def to_downstream(self, key: str) -> str:
        segments = key.split(self.delimiter)
        if len(segments) != len(self.mappers):
            raise ValueError(f"Expected {len(self.mappers)} segments in key, got {len(segments)}")
        results: list[str] = []
        for mapper, segment in zip(self.mappers, segments, strict=True):
            result = mapper.to_downstream(segment)
            if not isinstance(result, str):
                raise TypeError(
                    "ProductMapper child mappers must return a single key, "
                    f"but {mapper.airflow_name} returned multiple keys"
                )
            results.append(result)
        return self.delimiter.join(results)

    def to_partition_date(self, key: str) -> dt.datetime | None:
        """The one time part's anchor; None with no time part, several, or a wrong count."""
        segments = key.split(self.delimiter)
        if len(segments) != len(self.mappers):
            return None
        anchors = [
            anchor
            for mapper, segment in zip(self.mappers, segments, strict=True)
            if (anchor := mapper.to_partition_date(segment)) is not None
        ]
        return anchors[0] if len(anchors) == 1 else None

    def _fields(self) -> dict[str, Any]:
        return {"delimiter": self.delimiter, "mappers": [m.spec() for m in self.mappers]}


class ChainMapper(Mapper):
    """Mappers applied in turn, each to every key the previous one gave (duplicates kept)."""

    kind = "chain"
    airflow_name = "ChainMapper"

    def __init__(self, mappers: list[Mapper], *, max_downstream_keys: int | None = None) -> None:
        super().__init__(max_downstream_keys=max_downstream_keys)
        self.mappers = mappers

    def to_downstream(self, key: str) -> str | list[str]:
        keys = [key]
        for mapper in self.mappers:
            following: list[str] = []
            for current in keys:
                mapped = mapper.to_downstream(current)
                following.extend([mapped] if isinstance(mapped, str) else mapped)
            keys = following
        return keys[0] if len(keys) == 1 else keys

    def to_partition_date(self, key: str) -> dt.datetime | None:
        return self.mappers[-1].to_partition_date(key)

    def _fields(self) -> dict[str, Any]:
        return {"mappers": [m.spec() for m in self.mappers]}


def _check_pair(mapper: Mapper, window: Window) -> None:
    if mapper.decodes_to is not window.decodes_to:
        raise TypeError(
            f"{window.airflow_name} expects decoded values of type "
            f"{window.decodes_to.__name__!r}, but {mapper.airflow_name} decodes to "
            f"{mapper.decodes_to.__name__!r}. Pair a window and an upstream mapper whose "
            "'expected_decoded_type' match."
        )


class RollupMapper(Mapper):
    """Many upstream keys into one downstream key: `upstream_mapper` maps each key, `window`
    lists the upstream keys a downstream key needs, `wait_policy` says when it fires."""

    kind = "rollup"
    airflow_name = "RollupMapper"
    is_rollup = True

    def __init__(
        self,
        *,
        upstream_mapper: Mapper,
        window: Window,
        wait_policy: WaitPolicy | None = None,
        max_downstream_keys: int | None = None,
    ) -> None:
        super().__init__(max_downstream_keys=max_downstream_keys)
        _check_pair(upstream_mapper, window)
        self.upstream_mapper = upstream_mapper
        self.window = window
        self.wait_policy: WaitPolicy = wait_policy or WaitForAll()

    def to_downstream(self, key: str) -> str | list[str]:
        return self.upstream_mapper.to_downstream(key)

    def to_upstream(self, key: str) -> frozenset[str]:
        """Every upstream key `key` waits for."""
        decoded = self.upstream_mapper.decode_downstream(key)
        return frozenset(
            self.upstream_mapper.encode_upstream(item) for item in self.window.to_upstream(decoded)
        )

    def satisfaction(self, key: str, *, matched: Iterable[str]) -> Satisfaction:
        """Whether the run for `key` fires, given the upstream keys that arrived."""
        return self.wait_policy.is_satisfied_by_keys(
            matched=set(matched), expected=self.to_upstream(key)
        )

    def to_partition_date(self, key: str) -> dt.datetime | None:
        return self.upstream_mapper.to_partition_date(key)

    def _fields(self) -> dict[str, Any]:
        return {
            "upstream_mapper": self.upstream_mapper.spec(),
            "window": self.window.spec(),
            "wait_policy": self.wait_policy.spec(),
        }


_FAN_OUT_DEFAULTS: dict[str, type[TemporalMapper]] = {
    "DayWindow": StartOfHourMapper,
    "WeekWindow": StartOfDayMapper,
    "MonthWindow": StartOfDayMapper,
    "QuarterWindow": StartOfMonthMapper,
    "YearWindow": StartOfMonthMapper,
}


class FanOutMapper(Mapper):
    """One upstream key into one downstream key per member of its period: `upstream_mapper`
    reads the period start, `window` lists the members, `downstream_mapper` formats each."""

    kind = "fan_out"
    airflow_name = "FanOutMapper"

    def __init__(
        self,
        *,
        upstream_mapper: Mapper,
        window: Window,
        downstream_mapper: Mapper | None = None,
        max_downstream_keys: int | None = None,
    ) -> None:
        if downstream_mapper is None:
            default = _FAN_OUT_DEFAULTS.get(window.airflow_name)
            if default is None:
                raise ValueError(
                    f"FanOutMapper has no default downstream_mapper for window type "
                    f"{window.airflow_name}; pass downstream_mapper explicitly."
                )
            downstream_mapper = default()
        super().__init__(max_downstream_keys=max_downstream_keys)
        self.upstream_mapper = upstream_mapper
        self.window = window
        self.downstream_mapper = downstream_mapper

    def to_downstream(self, key: str) -> list[str]:
        formatted = self.upstream_mapper.to_downstream(key)
        if not isinstance(formatted, str):
            raise TypeError(
                "FanOutMapper.upstream_mapper must produce a single key from "
                "to_downstream; chained fan-out (mapper that itself returns multiple keys) "
                "is not supported."
            )
        coarse = self.upstream_mapper.decode_downstream(formatted)
        return [self._format(item) for item in self.window.to_upstream(coarse)]

    def _format(self, item: Any) -> str:
        if isinstance(self.downstream_mapper, TemporalMapper):
            return self.downstream_mapper.format(item)
        if isinstance(item, dt.datetime):
            return item.isoformat()
        return str(item)

    def to_partition_date(self, key: str) -> dt.datetime | None:
        return self.downstream_mapper.to_partition_date(key)

    def _fields(self) -> dict[str, Any]:
        return {
            "upstream_mapper": self.upstream_mapper.spec(),
            "window": self.window.spec(),
            "downstream_mapper": self.downstream_mapper.spec(),
        }


def queue_keys(
    mapper: Mapper, key: str, *, global_cap: int = DEFAULT_MAX_DOWNSTREAM_KEYS
) -> list[str]:
    """The downstream keys one event with partition `key` queues (airflow/assets/manager.py
    `_queue_partitioned_dags`): the mapper's `max_downstream_keys`, else `global_cap`, bounds
    them; over it, none (FanOutExceeded). A mapper that raises raises here too (Airflow logs
    "failed to map partition_key" and skips the target Dag)."""
    mapped = mapper.to_downstream(key)
    keys = [mapped] if isinstance(mapped, str) else list(mapped)
    if mapper.max_downstream_keys is not None:
        cap, source = (
            mapper.max_downstream_keys,
            f"max_downstream_keys={mapper.max_downstream_keys}",
        )
    else:
        cap, source = global_cap, f"[scheduler] partition_mapper_max_downstream_keys={global_cap}"
    if len(keys) > cap:
        raise FanOutExceeded(
            f"produced {len(keys)} downstream keys from partition_key='{key}', exceeding {source}."
        )
    return keys


# --- the definition form --------------------------------------------------------------------


def _cap_arg(spec: Mapping[str, Any]) -> dict[str, Any]:
    return (
        {"max_downstream_keys": spec["max_downstream_keys"]}
        if "max_downstream_keys" in spec
        else {}
    )


def window_from_spec(spec: Mapping[str, Any]) -> Window:
    kind = spec.get("kind")
    if kind == "segment":
        return SegmentWindow(spec.get("segments", []))
    if kind not in WINDOWS:
        raise PartitionSpecError(f"unknown window kind {kind!r}")
    return WINDOWS[kind](direction=spec.get("direction", "forward"))


def wait_policy_from_spec(spec: Mapping[str, Any] | None) -> WaitPolicy:
    if spec is None or spec.get("kind") == "wait_for_all":
        return WaitForAll()
    if spec.get("kind") == "minimum_count" and isinstance(spec.get("n"), int):
        return MinimumCount(spec["n"])
    raise PartitionSpecError(f"unknown wait policy {dict(spec)!r}")


def mapper_from_spec(spec: Mapping[str, Any]) -> Mapper:
    """A mapper from its definition form (the module docstring's shapes); raises Airflow's
    error where Airflow refuses the same mapper (at Dag parse or when the scheduler decodes
    it), PartitionSpecError for a malformed document."""
    kind = spec.get("kind")
    if kind in TEMPORAL:
        kwargs = {k: spec[k] for k in ("timezone", "input_format", "output_format") if k in spec}
        return TEMPORAL[kind](**kwargs, **_cap_arg(spec))
    if kind == "identity":
        return IdentityMapper(**_cap_arg(spec))
    if kind == "allowed_key":
        return AllowedKeyMapper(list(spec["allowed_keys"]), **_cap_arg(spec))
    if kind == "fixed_key":
        return FixedKeyMapper(spec["downstream_key"], **_cap_arg(spec))
    if kind in ("product", "chain"):
        children = [mapper_from_spec(m) for m in spec.get("mappers", [])]
        if len(children) < 2:
            raise PartitionSpecError(f"a {kind} mapper needs at least two mappers")
        if kind == "product":
            return ProductMapper(children, delimiter=spec.get("delimiter", "|"), **_cap_arg(spec))
        return ChainMapper(children, **_cap_arg(spec))
    if kind == "rollup":
        upstream = mapper_from_spec(spec["upstream_mapper"])
        window = window_from_spec(spec["window"])
        policy = wait_policy_from_spec(spec.get("wait_policy"))
        return RollupMapper(
            upstream_mapper=upstream, window=window, wait_policy=policy, **_cap_arg(spec)
        )
    if kind == "fan_out":
        upstream = mapper_from_spec(spec["upstream_mapper"])
        window = window_from_spec(spec["window"])
        downstream = spec.get("downstream_mapper")
        return FanOutMapper(
            upstream_mapper=upstream,
            window=window,
            downstream_mapper=mapper_from_spec(downstream) if downstream else None,
            **_cap_arg(spec),
        )
    raise PartitionSpecError(f"unknown partition mapper kind {kind!r}")


# --- CronPartitionTimetable (airflow/timetables/trigger.py) ---------------------------------


@dataclass(frozen=True)
class Partition:
    """One partition of a cron partition timetable: its date (a UTC instant) and its key."""

    date: dt.datetime
    key: str


class CronPartitionTimetable:
    """Runs at each tick of `cron`; a run's partition date is its run date moved `run_offset`
    ticks (forward if positive), its key that date's wall clock in `timezone` formatted with
    `key_format`."""

    def __init__(
        self,
        cron: str,
        *,
        timezone: str | int,
        run_offset: Any = None,
        key_format: str = DEFAULT_INPUT_FORMAT,
    ) -> None:
        self.tz = parse_zone(timezone)
        if isinstance(run_offset, bool) or not isinstance(run_offset, (int, type(None))):
            raise ValueError("Run offset other than integer not supported yet.")
        self.cron = cron
        self._run_offset_given: int | None = run_offset  # the spec carries the SDK's None
        self.run_offset = run_offset or 0
        self.key_format = key_format
        # _Cron only reads the zone through astimezone and utcoffset: any tzinfo does.
        self._steps = _Cron(cron, cast(ZoneInfo, self.tz))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> CronPartitionTimetable:
        return cls(
            spec["cron"],
            timezone=spec["timezone"],
            run_offset=spec.get("run_offset"),
            key_format=spec.get("key_format", DEFAULT_INPUT_FORMAT),
        )

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "cron_partition",
            "cron": self.cron,
            "timezone": zone_spec(self.tz),
            "run_offset": self._run_offset_given,
            "key_format": self.key_format,
        }

    def format_key(self, date: dt.datetime) -> str:
        return date.astimezone(self.tz).strftime(self.key_format)

    def partition(self, run_date: dt.datetime) -> Partition:
        """`_get_partition_info`: the partition of the run due at `run_date`."""
        date = run_date
        for _ in range(abs(self.run_offset)):
            date = self._steps.next(date) if self.run_offset > 0 else self._steps.prev(date)
        return Partition(date=date, key=self.format_key(date))

    def _localize(self, value: dt.datetime) -> dt.datetime:
        """`localize_partition_datetime`: the wall clock of `value` read in the zone."""
        return make_aware(value.replace(tzinfo=None), self.tz).astimezone(UTC)

    def partitions(self, *, earliest: dt.datetime, latest: dt.datetime) -> list[Partition]:
        """`iter_partition_dagrun_infos` (a backfill's partitions): every tick whose date is in
        [earliest, latest], both bounds' wall clocks read in the timetable's zone."""
        current = self._steps.align_next(self._localize(earliest))
        last = self._localize(latest)
        found = []
        while current <= last:
            found.append(Partition(date=current, key=self.format_key(current)))
            current = self._steps.next(current)
        return found

    def resolve_partition_date(self, key: str | None) -> dt.datetime | None:
        """The period start a key stands for (`_decode_partition_date`)."""
        if key is None:
            return None
        try:
            naive = dt.datetime.strptime(key, self.key_format)
        except ValueError as exc:
            raise InvalidPartitionKeyError(
                f"Partition key {key!r} does not match the timetable's "
                f"key_format {self.key_format!r}: {exc}"
            ) from exc
        return make_aware(naive, self.tz)


# --- PartitionedAssetTimetable (airflow/timetables/simple.py) -------------------------------


def _asset_refs(spec: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(assets as (name, uri), references as ("name"|"uri", value)), in the spec's order."""
    assets = [(a["name"], a["uri"]) for a in spec.get("assets", [])]
    refs = []
    for ref in spec.get("asset_refs", []):
        if set(ref) not in ({"name"}, {"uri"}):
            raise PartitionSpecError(f"an asset reference has a name or a uri, not {ref!r}")
        ((field, value),) = ref.items()
        refs.append((field, value))
    return assets, refs


def _refs_spec(assets: list[tuple[str, str]], refs: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "assets": [{"name": name, "uri": uri} for name, uri in assets],
        "asset_refs": [{field: value} for field, value in refs],
    }


class PartitionedAssetTimetable:
    """Which mapper each upstream asset's events go through, and a run key's partition date.

    `assets` and `asset_refs` are those of the Dag's asset condition, in Airflow's order; each
    `partition_mapper_config` entry names assets (or references) and their mapper, a later
    entry overriding an earlier one. Lookup is Airflow's `get_partition_mapper`: by name when a
    name is given (an unknown name falls to the default *without* trying the uri, so a mapper
    configured by `Asset.ref(uri=...)` never applies to the named assets the scheduler asks
    for), by uri only when no name is given, else `default_partition_mapper` (identity)."""

    def __init__(
        self,
        *,
        assets: list[tuple[str, str]],
        asset_refs: list[tuple[str, str]],
        config: list[tuple[list[tuple[str, str]], list[tuple[str, str]], Mapper]],
        default: Mapper,
    ) -> None:
        self.assets = assets
        self.asset_refs = asset_refs
        self.config = config
        self.default = default
        self._by_name: dict[str, Mapper] = {}
        self._by_uri: dict[str, Mapper] = {}
        for entry_assets, entry_refs, mapper in config:
            for name, uri in entry_assets:
                self._by_name[name] = mapper
                self._by_uri[uri] = mapper
            for field, value in entry_refs:
                (self._by_name if field == "name" else self._by_uri)[value] = mapper

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PartitionedAssetTimetable:
        assets, refs = _asset_refs(spec)
        config = []
        for entry in spec.get("partition_mapper_config", []):
            entry_assets, entry_refs = _asset_refs(entry)
            config.append((entry_assets, entry_refs, mapper_from_spec(entry["mapper"])))
        default = spec.get("default_partition_mapper") or {"kind": "identity"}
        return cls(assets=assets, asset_refs=refs, config=config, default=mapper_from_spec(default))

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "partitioned_asset",
            **_refs_spec(self.assets, self.asset_refs),
            "partition_mapper_config": [
                {**_refs_spec(a, r), "mapper": m.spec()} for a, r, m in self.config
            ],
            "default_partition_mapper": self.default.spec(),
        }

    def mapper_for(self, *, name: str = "", uri: str = "") -> Mapper:
        if name:
            return self._by_name.get(name, self.default)
        if uri:
            return self._by_uri.get(uri, self.default)
        return self.default

    def resolve_partition_date(self, key: str | None) -> dt.datetime | None:
        """`_decode_partition_date`: the anchor every time mapper of the condition's assets
        agrees on, None when none is a time or they disagree; a mapper that cannot read the
        key raises InvalidPartitionKeyError."""
        if key is None:
            return None
        mappers = [self.mapper_for(name=name, uri=uri) for name, uri in self.assets]
        mappers += [
            self.mapper_for(name=value) if field == "name" else self.mapper_for(uri=value)
            for field, value in self.asset_refs
        ]
        anchors: set[dt.datetime] = set()
        for mapper in mappers:
            try:
                anchor = mapper.to_partition_date(key)
            except ValueError as exc:
                raise InvalidPartitionKeyError(
                    f"Partition key {key!r} is invalid for this timetable's mappers: {exc}"
                ) from exc
            if anchor is not None:
                anchors.add(anchor)
        return anchors.pop() if len(anchors) == 1 else None
