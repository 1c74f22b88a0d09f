"""Time schedules: when a Dag's next run is due and which data interval it covers.

Pure computation, no database: `Timetable.from_spec` reads a Dag definition's `timetable`
(a cron string or preset, or one of the kinds below) and `next_run` answers what Airflow
3.3.2's scheduler asks its timetable (`next_dagrun_info_v2`): given the last automated run
and the Dag's start date, end date and catchup, the next run's logical date, data interval
and `run_after`. The answers equal Airflow's on every case of the golden corpus
(`tests/data/timetables/`, produced by Airflow's own timetables): same wall clock, same time
zone and DST behaviour.

The kinds, as Airflow names them:

- `cron_trigger` (CronTriggerTimetable; a plain cron string or preset is this kind, as in
  Airflow 3 with `[scheduler] create_cron_data_intervals` at its default False): a run at
  each tick, logical date = tick - `interval` (default 0), `run_immediately` deciding the
  first run of a Dag without a start date.
- `cron_data_interval` (CronDataIntervalTimetable): intervals between ticks, a run at the
  end of each, logical date = the interval's start.
- `delta_trigger` / `delta_data_interval` (DeltaTriggerTimetable /
  DeltaDataIntervalTimetable): the same with a fixed number of seconds between runs.
- `multiple_cron_trigger` (MultipleCronTriggerTimetable): several crons, one run per time.
- `events` (EventsTimetable): a run at each listed date.
- `once` (`@once`): one run, at the start date (or as soon as possible).

A cron has 5 fields, or 6: croniter, which Airflow 3.3.2 hands the expression to, reads a sixth
field as the seconds, last (`*/30 * * * * *` ticks every second of minutes 0 and 30; `0 12 * * *
*/20` at 12:00:00, 12:00:20 and 12:00:40); a field croniter refuses is named in the error.

How the wall clock is read (the rules Airflow's cron timetables follow):

- a tick is found on the naive local wall clock of the timetable's zone (croniter, the
  library Airflow uses, so an expression means the same ticks), then placed on the time line:
  a repeated wall time takes its second occurrence, a skipped one the instant the clock jumps
  past it (a skipped 02:30 becomes 03:30 new time);
- a cron whose hour field is `*` (it ticks every hour) steps by elapsed time instead, so it
  ticks in the repeated hour too and never doubles or drops a tick at a transition;
- delta timetables step by elapsed seconds.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import CasingTypeEnum, ExpressionDescriptor
from cron_descriptor.Exception import FormatException, MissingFieldException
from croniter import CroniterBadCronError, CroniterBadDateError, croniter

UTC = dt.UTC

CRON_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}
KINDS = (
    "cron_trigger",
    "cron_data_interval",
    "delta_trigger",
    "delta_data_interval",
    "multiple_cron_trigger",
    "events",
    "once",
)
# Airflow's class name for each kind (its `timetable_summary` and `timetable_description`
# are per class; the API's `timetable_type` field is this name).
AIRFLOW_CLASSES = {
    "cron_trigger": "CronTriggerTimetable",
    "cron_data_interval": "CronDataIntervalTimetable",
    "delta_trigger": "DeltaTriggerTimetable",
    "delta_data_interval": "DeltaDataIntervalTimetable",
    "multiple_cron_trigger": "MultipleCronTriggerTimetable",
    "events": "EventsTimetable",
    "once": "OnceTimetable",
}


class TimetableError(ValueError):
    """A timetable the service cannot run: the message names the problem."""


@dataclass(frozen=True)
class RunInfo:
    """One run of a time schedule (Airflow's DagRunInfo): it may be created from `run_after` on,
    and covers [data_interval_start, data_interval_end]; its logical date is the start."""

    run_after: dt.datetime
    data_interval_start: dt.datetime | None
    data_interval_end: dt.datetime | None

    @property
    def logical_date(self) -> dt.datetime | None:
        return self.data_interval_start

    @classmethod
    def exact(cls, at: dt.datetime) -> RunInfo:
        return cls(run_after=at, data_interval_start=at, data_interval_end=at)

    @classmethod
    def interval(cls, start: dt.datetime, end: dt.datetime) -> RunInfo:
        return cls(run_after=end, data_interval_start=start, data_interval_end=end)


@dataclass(frozen=True)
class Restriction:
    """The Dag's bounds (Airflow's TimeRestriction): runs from `earliest` (its start date) to
    `latest` (its end date), and whether missed runs are caught up."""

    earliest: dt.datetime | None
    latest: dt.datetime | None
    catchup: bool


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TimetableError(f"unknown time zone {name!r} (expected an IANA name)") from exc


def place(naive: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    """A local wall time as a UTC instant: a repeated time's second occurrence, a skipped
    time's instant after the jump (both are the later of the two readings of the wall time)."""
    first = naive.replace(fold=0, tzinfo=tz).astimezone(UTC)
    second = naive.replace(fold=1, tzinfo=tz).astimezone(UTC)
    return max(first, second)


def local(value: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    """An aware datetime as an aware UTC one; a naive one is a wall time in `tz`."""
    if value.tzinfo is None:
        return place(value, tz)
    return value.astimezone(UTC)


class _Steps:
    """The step functions both timetable families are built on: the next/previous tick from a
    time, and aligning a time to a tick (itself when it is one)."""

    def next(self, current: dt.datetime) -> dt.datetime:
        raise NotImplementedError

    def prev(self, current: dt.datetime) -> dt.datetime:
        raise NotImplementedError

    def align_next(self, current: dt.datetime) -> dt.datetime:
        raise NotImplementedError

    def align_prev(self, current: dt.datetime) -> dt.datetime:
        raise NotImplementedError


_parsed = threading.local()


def _croniter(expression: str) -> croniter:
    """This thread's parsed croniter of `expression` (parsed once: it costs as much as a step;
    one per thread because a croniter is stateful)."""
    cache: dict[str, croniter] = _parsed.__dict__.setdefault("cache", {})
    found = cache.get(expression)
    if found is None:
        if len(cache) >= 1024:
            cache.clear()
        found = cache[expression] = croniter(expression)
    return found


@functools.lru_cache(maxsize=1 << 16)
def _wall_tick(expression: str, naive: dt.datetime, forward: bool) -> dt.datetime:
    """croniter's next (or previous) tick of `expression` after the naive wall time `naive`.
    Memoized: the ticks of a wall clock are the same in every zone, so the Dags of a pass that
    share an expression (and the corpus test's zones) ask croniter once."""
    it = _croniter(expression)
    if forward:
        return it.get_next(dt.datetime, start_time=naive)
    return it.get_prev(dt.datetime, start_time=naive)


MEMO_SIZE = 4096


# A cron's fields as croniter (so Airflow) reads them: a sixth field is the seconds, last.
CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week", "second")


def _bad_field(expression: str) -> str:
    """The first field croniter refuses on its own ("field 6 (second) '61': "), or ""."""
    parts = expression.split()
    for index, part in enumerate(parts):
        probe = ["*"] * len(parts)
        probe[index] = part
        try:
            croniter(" ".join(probe))
        except (CroniterBadCronError, CroniterBadDateError, ValueError):
            return f"field {index + 1} ({CRON_FIELDS[index]}) {part!r}: "
    return ""


class _Cron(_Steps):
    def __init__(self, expression: str, tz: ZoneInfo) -> None:
        self.expression = CRON_PRESETS.get(expression, expression)
        self.tz = tz
        if len(self.expression.split()) not in (5, 6):
            # croniter (and so Airflow) also reads a seventh field, a year; not supported here.
            raise TimetableError(
                f"cron expression {expression!r} must have 5 or 6 fields (minute hour "
                "day-of-month month day-of-week, and seconds sixth, as Airflow reads it)"
            )
        try:
            fields = _croniter(self.expression).expanded
        except (CroniterBadCronError, CroniterBadDateError, ValueError) as exc:
            raise TimetableError(
                f"invalid cron expression {expression!r}: {_bad_field(self.expression)}{exc}"
            ) from exc
        # An hourly (or finer) cron steps by elapsed time, so the repeated hour gets its ticks.
        self.every_hour = fields[1] == ["*"]
        # This instance's steps (by instant: equal instants in any zone are one key), for
        # `align_*` and a pass asking a step again; a Timetable lives for one Dag's pass.
        self._memo: dict[tuple[dt.datetime, bool], dt.datetime] = {}

    def _step(self, current: dt.datetime, *, forward: bool) -> dt.datetime:
        key = (current, forward)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            found = self._memo[key] = self._compute(current, forward=forward)
        return found

    def _compute(self, current: dt.datetime, *, forward: bool) -> dt.datetime:
        current = current.astimezone(UTC)  # elapsed-time steps below, never wall-clock ones
        naive = current.astimezone(self.tz).replace(tzinfo=None, fold=0)
        try:
            tick = _wall_tick(self.expression, naive, forward)
        except CroniterBadDateError as exc:
            # A cron that never ticks (`0 0 31 2 *`): Airflow's scheduler logs it, no next run.
            raise TimetableError(f"cron expression {self.expression!r}: {exc}") from exc
        if self.every_hour:
            return (current + (tick - naive)).astimezone(UTC)
        return place(tick, self.tz)

    def next(self, current: dt.datetime) -> dt.datetime:
        return self._step(current, forward=True)

    def prev(self, current: dt.datetime) -> dt.datetime:
        return self._step(current, forward=False)

    def align_next(self, current: dt.datetime) -> dt.datetime:
        following = self.next(current)
        return current if self.prev(following) == current else following

    def align_prev(self, current: dt.datetime) -> dt.datetime:
        preceding = self.prev(current)
        return current if self.next(preceding) == current else preceding


class _Delta(_Steps):
    def __init__(self, delta: dt.timedelta) -> None:
        if delta <= dt.timedelta(0):
            raise TimetableError(f"schedule interval must be positive, not {delta}")
        self.delta = delta

    def next(self, current: dt.datetime) -> dt.datetime:
        return current.astimezone(UTC) + self.delta

    def prev(self, current: dt.datetime) -> dt.datetime:
        return current.astimezone(UTC) - self.delta

    def align_next(self, current: dt.datetime) -> dt.datetime:
        return current

    def align_prev(self, current: dt.datetime) -> dt.datetime:
        return current

    def floor(self, at: dt.datetime) -> dt.datetime:
        """The latest multiple of the delta since the epoch at or before `at`."""
        seconds = at.timestamp()
        return dt.datetime.fromtimestamp(seconds - seconds % self.delta.total_seconds(), tz=UTC)


def _describe_cron(expression: str) -> str:
    """Airflow 3.3.2's text of a cron (`CronMixin._describe_with_dom_dow_fix`): cron-descriptor
    in sentence case with a 24-hour clock; a day of month and a weekday both restricted are
    described apart and joined by "(or)", since cron reads them as either."""

    def describe(text: str) -> str:
        return ExpressionDescriptor(
            text, casing_type=CasingTypeEnum.Sentence, use_24hour_time_format=True
        ).get_description()

    try:
        fields = expression.split()
        if len(fields) > 5:
            return ""  # Airflow describes no cron of more than 5 fields (`CronMixin.__init__`)
        if len(fields) == 5 and fields[2] != "*" and fields[4] != "*":
            dom, dow = list(fields), list(fields)
            dom[4], dow[2] = "*", "*"
            return f"{describe(' '.join(dom))} (or) {describe(' '.join(dow))}"
        return describe(expression)
    except (FormatException, MissingFieldException):
        return ""


def _spell_delta(delta: dt.timedelta) -> str:
    """ "hour", "6 hours", "90 minutes", "1 day, 2:00:00" (the largest whole unit, else str)."""
    seconds = delta.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0:
            count = int(seconds // size)
            return unit if count == 1 else f"{count} {unit}s"
    return str(delta)


def parse_date(text: str, *, timezone: str) -> dt.datetime:
    """A definition's ISO 8601 date (start_date, end_date, an event) as aware UTC; without an
    offset it is a wall time in `timezone`, as Airflow reads a Dag's naive dates."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise TimetableError(f"invalid date {text!r} (expected ISO 8601)") from exc
    return local(value, zone(timezone))


def _seconds(value: Any, what: str) -> dt.timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TimetableError(f"{what} must be a number of seconds")
    return dt.timedelta(seconds=value)


@dataclass(frozen=True)
class Timetable:
    """A Dag's time schedule, normalized (`spec()` gives it back as stored)."""

    kind: str
    timezone: str = "UTC"
    crons: tuple[str, ...] = ()
    delta: dt.timedelta | None = None
    interval: dt.timedelta = dt.timedelta(0)
    run_immediately: bool | dt.timedelta | None = False
    event_dates: tuple[dt.datetime, ...] = ()
    restrict_to_events: bool = False
    description_text: str | None = None  # EventsTimetable's `description` parameter

    @classmethod
    def from_spec(cls, spec: str | dict[str, Any], *, timezone: str = "UTC") -> Timetable:
        """A definition's `timetable` value (validated by `dag_schema`) as a Timetable; `timezone`
        is the Dag's, which a cron kind uses unless it names its own. Raises TimetableError."""
        if isinstance(spec, str):
            spec = {"kind": "once"} if spec == "@once" else {"kind": "cron_trigger", "cron": spec}
        kind = spec.get("kind")
        if kind not in KINDS:
            raise TimetableError(f"unknown timetable kind {kind!r} (expected one of {KINDS})")
        tz_name = spec.get("timezone") or timezone
        tz = zone(tz_name)
        fields: dict[str, Any] = {"kind": kind, "timezone": tz_name}
        if kind in ("cron_trigger", "cron_data_interval"):
            fields["crons"] = (spec["cron"],)
        elif kind == "multiple_cron_trigger":
            if not spec.get("crons"):
                raise TimetableError("multiple_cron_trigger needs at least one cron expression")
            fields["crons"] = tuple(spec["crons"])
        elif kind in ("delta_trigger", "delta_data_interval"):
            fields["delta"] = _seconds(spec["delta"], "delta")
        elif kind == "events":
            dates = [
                local(d, tz) if isinstance(d, dt.datetime) else parse_date(d, timezone=tz_name)
                for d in spec.get("event_dates", ())
            ]
            fields["event_dates"] = tuple(sorted(dates))
            fields["restrict_to_events"] = bool(spec.get("restrict_to_events", False))
            fields["description_text"] = spec.get("description")
        if kind in ("cron_trigger", "delta_trigger", "multiple_cron_trigger"):
            fields["interval"] = _seconds(spec.get("interval", 0), "interval")
        if kind in ("cron_trigger", "multiple_cron_trigger"):
            run_immediately = spec.get("run_immediately", False)
            if run_immediately is not None and not isinstance(run_immediately, bool):
                run_immediately = _seconds(run_immediately, "run_immediately")
            fields["run_immediately"] = run_immediately
        timetable = cls(**fields)
        timetable.steps  # noqa: B018 - parse the crons now, so a bad one is refused at sync
        return timetable

    def spec(self) -> dict[str, Any]:
        """The stored form (JSON): `from_spec(t.spec()) == t`."""
        out: dict[str, Any] = {"kind": self.kind, "timezone": self.timezone}
        if self.kind == "multiple_cron_trigger":
            out["crons"] = list(self.crons)
        elif self.crons:
            out["cron"] = self.crons[0]
        if self.delta is not None:
            out["delta"] = self.delta.total_seconds()
        if self.kind in ("cron_trigger", "delta_trigger", "multiple_cron_trigger"):
            out["interval"] = self.interval.total_seconds()
        if self.kind in ("cron_trigger", "multiple_cron_trigger"):
            ri = self.run_immediately
            out["run_immediately"] = ri.total_seconds() if isinstance(ri, dt.timedelta) else ri
        if self.kind == "events":
            out["event_dates"] = [d.isoformat() for d in self.event_dates]
            out["restrict_to_events"] = self.restrict_to_events
            out["description"] = self.description_text
        return out

    @cached_property
    def steps(self) -> list[_Steps]:
        if self.crons:
            tz = zone(self.timezone)
            return [_Cron(expression, tz) for expression in self.crons]
        if self.delta is not None:
            return [_Delta(self.delta)]
        return []

    @property
    def summary(self) -> str:
        """Airflow's `timetable_summary`: the cron expression (a preset spelled out), the delta,
        the number of events, or `@once`."""
        if self.crons:
            return ", ".join(step.expression for step in self.steps)  # type: ignore[attr-defined]
        if self.delta is not None:
            return str(self.delta)
        if self.kind == "events":
            return self.description_text or f"{len(self.event_dates)} events"
        return "@once"

    @property
    def description(self) -> str:
        """Airflow's `timetable.description`, word for word: a cron's text by cron-descriptor
        (as Airflow renders it, with its fix for a day of month and a weekday both given), the
        crons' texts joined for several, the events' count and span, the fixed text of `@once`;
        empty for the delta timetables, as in Airflow."""
        if self.crons:
            return ", ".join(_describe_cron(step.expression) for step in self.steps)  # type: ignore[attr-defined]
        if self.kind == "events":
            if self.description_text is not None:
                return self.description_text
            if not self.event_dates:
                return "No events"
            tz = zone(self.timezone)
            first, last = (
                d.astimezone(tz).isoformat(sep="T")
                for d in (self.event_dates[0], self.event_dates[-1])
            )
            return f"{len(self.event_dates)} events between {first} and {last}"
        if self.kind == "once":
            return "Once, as soon as possible"
        return ""

    @property
    def text(self) -> str:
        """The schedule as a person reads it (the console): Airflow's description, with the
        time zone a cron's wall clock is read in ("At 03:00, Europe/Zurich"; UTC left out),
        and a delta spelled out ("Every 6 hours") where Airflow has no text."""
        if self.crons:
            text = self.description or self.summary
            return text if self.timezone == "UTC" else f"{text}, {self.timezone}"
        if self.delta is not None:
            return f"Every {_spell_delta(self.delta)}"
        return self.description

    @property
    def periodic(self) -> bool:
        """Airflow's `timetable.periodic`: False only for `@once`."""
        return self.kind != "once"

    @property
    def airflow_class(self) -> str:
        return AIRFLOW_CLASSES[self.kind]

    def next_run(
        self, *, last: RunInfo | None, restriction: Restriction, now: dt.datetime
    ) -> RunInfo | None:
        """The run after `last` (the Dag's latest automated run, or None), as Airflow's scheduler
        decides it at `now`; None when there is none (the end date passed, no events left)."""
        if last is not None and last.data_interval_start is None:
            last = None
        if self.kind in ("cron_trigger", "delta_trigger"):
            return _trigger(self, self.steps[0], last, restriction, now)
        if self.kind == "multiple_cron_trigger":
            return _multiple(self, last, restriction, now)
        if self.kind in ("cron_data_interval", "delta_data_interval"):
            return _data_interval(self.steps[0], last, restriction, now)
        if self.kind == "events":
            return _events(self.event_dates, last, restriction, now)
        return _once(last, restriction, now)


ASSET_OR_TIME = "asset_or_time"
ASSET_AND_TIME = "asset_and_time"


def with_assets(mode: str, summary: str, description: str) -> tuple[str, str]:
    """The summary and description of a timetable combined with an asset schedule: Airflow's
    AssetOrTimeSchedule's ("Asset or 0 3 * * *", "Triggered by assets or At 03:00") for
    `asset_or_time`, the same shape for the service's `asset_and_time`."""
    if mode == ASSET_AND_TIME:
        return f"Asset and {summary}", f"{description or summary}, when triggered by assets"
    return f"Asset or {summary}", f"Triggered by assets or {description}"


def _first_run(timetable: Timetable, steps: _Steps, now: dt.datetime) -> dt.datetime:
    """The first tick of a trigger timetable without a start date: the latest past tick when
    `run_immediately` is True, or when it is that close to now (a number of seconds, else 10%
    of the gap between ticks, at least 5 minutes; False and None both take that 10% rule, as
    Airflow's code does); otherwise the next tick."""
    if isinstance(steps, _Delta):
        return steps.align_prev(now)
    past, following = steps.align_prev(now), steps.align_next(now)
    if timetable.run_immediately is True:
        return past
    if isinstance(timetable.run_immediately, dt.timedelta):
        buffer = timetable.run_immediately
    else:
        buffer = max((following - past) / 10, dt.timedelta(minutes=5))
    return past if now - past <= buffer else following


def _trigger(
    timetable: Timetable,
    steps: _Steps,
    last: RunInfo | None,
    restriction: Restriction,
    now: dt.datetime,
) -> RunInfo | None:
    if restriction.catchup:
        if last is not None:
            tick = steps.next(last.data_interval_end)  # type: ignore[arg-type]
        elif restriction.earliest is None:
            tick = _first_run(timetable, steps, now)
        else:
            tick = steps.align_next(restriction.earliest)
    else:
        # Without catchup the run is never older than the latest tick due now.
        candidates = [steps.align_prev(now)]
        if last is not None:
            candidates.append(steps.next(last.data_interval_end))  # type: ignore[arg-type]
        elif restriction.earliest is None:
            candidates.append(_first_run(timetable, steps, now))
        if restriction.earliest is not None:
            candidates.append(steps.align_next(restriction.earliest))
        tick = max(candidates)
    if restriction.latest is not None and restriction.latest < tick:
        return None
    return RunInfo.interval((tick - timetable.interval).astimezone(UTC), tick)


def _multiple(
    timetable: Timetable, last: RunInfo | None, restriction: Restriction, now: dt.datetime
) -> RunInfo | None:
    """Each cron's answer; the earliest with catchup, else the latest one already due (or,
    when none is due, the earliest to come). Ties keep the first cron's."""
    infos = [_trigger(timetable, steps, last, restriction, now) for steps in timetable.steps]
    stamp = now.timestamp()

    def key(info: RunInfo | None) -> float:
        if info is None or info.logical_date is None:
            return math.inf
        ts = info.logical_date.timestamp()
        if restriction.catchup:
            return ts
        return -ts if ts <= stamp else ts

    return min(infos, key=key)


def _data_interval(
    steps: _Steps, last: RunInfo | None, restriction: Restriction, now: dt.datetime
) -> RunInfo | None:
    earliest = restriction.earliest
    if not restriction.catchup:
        earliest = _skip_to_latest(steps, earliest, now)
    elif earliest is not None:
        earliest = steps.align_next(earliest)
    if last is None:
        if earliest is None:
            return None
        start = earliest
    else:
        last_start, last_end = last.data_interval_start, last.data_interval_end
        # Realigned, so a changed schedule starts on its own grid.
        start = steps.align_prev(last_end)  # type: ignore[arg-type]
        if earliest is not None:
            start = max(start, earliest)
        if start <= last_start:  # type: ignore[operator]
            start = steps.next(start)
            if start <= last_start:  # type: ignore[operator]
                raise TimetableError(f"timetable did not advance past {last_start}")
    if restriction.latest is not None and start > restriction.latest:
        return None
    return RunInfo.interval(start, steps.next(start))


def _skip_to_latest(steps: _Steps, earliest: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """Without catchup, a data-interval timetable starts at the interval that ended last (a
    cron on a tick exactly now: the one that starts now)."""
    if isinstance(steps, _Delta):
        new_start = steps.prev(steps.floor(now))
        return new_start if earliest is None else max(new_start, earliest)
    last_start = steps.prev(now)
    next_start = steps.next(last_start)
    if next_start == now:
        new_start = last_start
    elif next_start > now:
        new_start = steps.prev(last_start)
    else:
        raise TimetableError(f"cron's next tick after {last_start} is before {now}")
    if earliest is None:
        return new_start
    return max(new_start, steps.align_next(earliest))


def _events(
    dates: Sequence[dt.datetime], last: RunInfo | None, restriction: Restriction, now: dt.datetime
) -> RunInfo | None:
    earliest = restriction.earliest
    if not restriction.catchup and (earliest is None or now > earliest):
        earliest = now
    for date in dates:
        if earliest is not None and date < earliest:
            continue
        if last is not None and date <= last.data_interval_end:  # type: ignore[operator]
            continue
        break
    else:
        return None
    if restriction.latest is not None and date > restriction.latest:
        return None
    return RunInfo.exact(date)


def _once(last: RunInfo | None, restriction: Restriction, now: dt.datetime) -> RunInfo | None:
    if last is not None:
        return None
    at = restriction.earliest or now
    if restriction.latest is not None and at > restriction.latest:
        return None
    return RunInfo.exact(at)
