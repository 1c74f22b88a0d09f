"""Regenerate the golden corpus of time schedules from Airflow 3.3.2's own timetables.

Run with the Airflow virtualenv's python (bin/airflow-worker builds it):

    .venv-airflow-worker/bin/python tests/data/timetables/generate.py

It writes `corpus-<zone>.json.gz` beside this file, one per time zone, each as soon as it is
done: for every case (a timetable in our definition format, a Dag time zone, a start and an
end date) the answers of Airflow's
`next_dagrun_info_v2`, called as its scheduler calls it (`TimeRestriction(start_date, end_date,
catchup)`, the last automated run's `DagRunInfo`, the wall clock patched to the probe's "now"):

- `series` (catchup on): every run from the start date on, each asked from the previous one,
  until Airflow answers None (the end date, two years after the start). Timetables ticking
  more often than every 4 hours walk a 2-day window around each DST transition of the two
  years instead (plus the first 2 days), which holds every repeated and skipped hour.
- `probes` (catchup off, and the first run of catchup on without a start date): at a set of
  "now"s (every 673 hours over the two years, and every 30 minutes in the 3 hours around each
  transition) the answer with no previous run (with and without the start date, catchup off;
  without it, catchup on), and, with the start date, after the latest run due at that "now"
  and after one 3 ticks older (an unpause after a pause).

Times are UTC epoch seconds. Stored compact (`compact()`, format 2; the corpus test's `expand`
reads it back), a run as [run_after - base, data_interval_start - run_after,
data_interval_end - run_after] ([.., null, null] without a data interval; its logical date is
the interval's start), where the base of a series' run is the run before it (the first: the
series' `earliest`) and the base of a probe's runs is its "now"; probes are rows [now - the
previous probe's now, last, catchup, from the start date (0/1), next]. `generate.py compact
FILE...` rewrites files of format 1 (runs as [logical, start, end, run_after], probes as
objects) to it.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import sys
import time
from pathlib import Path
from unittest import mock
from zoneinfo import ZoneInfo

import pendulum
from airflow.timetables import events as af_events
from airflow.timetables import interval as af_interval
from airflow.timetables import simple as af_simple
from airflow.timetables import trigger as af_trigger
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction

HERE = Path(__file__).resolve().parent
UTC = dt.UTC
ZONES = [
    "America/New_York",
    "Europe/Zurich",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "America/Santiago",
]
START = dt.datetime(2026, 1, 1)
YEARS = 2

# Plain cron strings and presets: Airflow 3 makes them CronTriggerTimetable.
CRONS = [
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
    "0 3 * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0 2 * * *",
    "15 2,3 * * *",
    "59 1 * * *",
    "45 23 * * *",
    "0 0,12 * * *",
    "5 * * * *",
    "30 * * * *",
    "0 */2 * * *",
    "0 */3 * * *",
    "0 1-4 * * *",
    "0 0 * * 1-5",
    "0 9 * * 1",
    "0 6 * * 0,6",
    "0 12 1,15 * *",
    "0 0 L * *",
    "0 0 29 2 *",
    "0 0 31 * *",
    "0 0 1 1,4,7,10 *",
    "0 2 1 * 1",
    "0 1 * * 0#1",
    "0 * * * 1",
    "*/15 * * * *",
    "*/30 * * * *",
    "*/5 1-3 * * *",
    "* 2 * * *",
    "0 3 * 3,4,10,11 0",
    # Around the transitions of the six zones: the skipped and the repeated wall times.
    "15 2 * * *",
    "45 1 * * *",
    "30 23 * * *",
    "0 0 * * 7",
    "30 2 8-14 3 0",
    "30 1 1-7 11 0",
    "45 2 * 9 0",
    "0 0 * 4,9 0,6",
    "0 2 * 10 0",
    "0 4 1 * *",
    "0 0 1-7 * 1",
    "0 12 * * 2#3",
    "0 0 1 */2 *",
    "0 0 1 jan,jul *",
    "0 8 * * mon-fri",
]
DATA_INTERVAL_CRONS = [
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "0 3 * * *",
    "30 2 * * *",
    "30 1 * * *",
    "30 * * * *",
    "0 */3 * * *",
    "0 0 * * 1-5",
    "*/30 * * * *",
]
OTHERS = [
    {"kind": "cron_trigger", "cron": "0 3 * * *", "interval": 86400},
    {"kind": "cron_trigger", "cron": "30 2 * * *", "interval": 3600, "run_immediately": True},
    {"kind": "cron_trigger", "cron": "@hourly", "run_immediately": True},
    {"kind": "cron_trigger", "cron": "@daily", "run_immediately": 7200},
    {"kind": "cron_trigger", "cron": "0 9 * * 1-5", "run_immediately": None},
    {"kind": "cron_trigger", "cron": "0 3 * * *", "timezone": "Asia/Tokyo"},
    {"kind": "delta_trigger", "delta": 21600},
    {"kind": "delta_trigger", "delta": 5400, "interval": 5400},
    {"kind": "delta_trigger", "delta": 86400},
    {"kind": "delta_data_interval", "delta": 3600},
    {"kind": "delta_data_interval", "delta": 86400},
    {"kind": "delta_data_interval", "delta": 2700},
    {"kind": "multiple_cron_trigger", "crons": ["0 3 * * *", "30 14 * * 1-5"]},
    {"kind": "multiple_cron_trigger", "crons": ["30 2 * * *", "0 3 * * *"], "interval": 3600},
    {"kind": "multiple_cron_trigger", "crons": ["@daily", "0 12 * * 0"], "run_immediately": True},
    {"kind": "once"},
]


def events_case(zone: str) -> dict:
    """Event dates around the zone's transitions, given as local wall times (some repeated or
    skipped), as a DAG author writes them."""
    local = [
        "2026-01-05T10:00:00",
        "2026-03-08T02:30:00",
        "2026-03-29T02:30:00",
        "2026-04-05T02:15:00",
        "2026-09-27T02:30:00",
        "2026-10-25T02:30:00",
        "2026-11-01T01:30:00",
        "2027-03-14T01:59:00",
        "2027-06-01T00:00:00",
        "2027-06-01T00:00:00",
        "2027-12-31T23:59:00",
    ]
    return {"kind": "events", "event_dates": local, "timezone": zone}


def secs(value: int | float | None) -> dt.timedelta:
    return dt.timedelta(seconds=value or 0)


def airflow_timetable(spec: str | dict, zone: str):
    """Our definition -> Airflow's timetable (the mapping the service implements)."""
    if isinstance(spec, str):
        if spec == "@once":
            return af_simple.OnceTimetable()
        return af_trigger.CronTriggerTimetable(spec, timezone=zone)
    kind, tz = spec["kind"], spec.get("timezone", zone)
    run_immediately = spec.get("run_immediately", False)
    if isinstance(run_immediately, (int, float)) and not isinstance(run_immediately, bool):
        run_immediately = secs(run_immediately)
    if kind == "cron_trigger":
        return af_trigger.CronTriggerTimetable(
            spec["cron"],
            timezone=tz,
            interval=secs(spec.get("interval")),
            run_immediately=run_immediately,
        )
    if kind == "cron_data_interval":
        return af_interval.CronDataIntervalTimetable(spec["cron"], tz)
    if kind == "delta_trigger":
        return af_trigger.DeltaTriggerTimetable(
            secs(spec["delta"]), interval=secs(spec.get("interval"))
        )
    if kind == "delta_data_interval":
        return af_interval.DeltaDataIntervalTimetable(secs(spec["delta"]))
    if kind == "multiple_cron_trigger":
        return af_trigger.MultipleCronTriggerTimetable(
            *spec["crons"],
            timezone=tz,
            interval=secs(spec.get("interval")),
            run_immediately=run_immediately,
        )
    if kind == "events":
        # An author's naive event date is read in the Dag's time zone (pendulum's resolution).
        ptz = pendulum.timezone(tz)
        dates = [
            pendulum.instance(
                ptz.convert(dt.datetime.fromisoformat(d).replace(fold=1))
            ).in_timezone("UTC")
            for d in spec["event_dates"]
        ]
        return af_events.EventsTimetable(
            dates, restrict_to_events=spec.get("restrict_to_events", False)
        )
    if kind == "once":
        return af_simple.OnceTimetable()
    raise ValueError(kind)


def local_to_utc(naive: dt.datetime, zone: str) -> pendulum.DateTime:
    # Airflow's DAG: a naive start_date is parsed in the Dag's time zone, then converted to UTC.
    return pendulum.instance(pendulum.timezone(zone).convert(naive.replace(fold=1))).in_timezone(
        "UTC"
    )


class Clock:
    """Airflow's timetables read the wall clock (utcnow, time.time): patch it to the probe."""

    def __init__(self) -> None:
        self.now = pendulum.now("UTC")
        self._patches = [
            mock.patch.object(af_trigger, "utcnow", lambda: self.now),
            mock.patch.object(af_interval, "utcnow", lambda: self.now),
            mock.patch.object(af_events.timezone, "utcnow", lambda: self.now),
            mock.patch.object(af_simple.timezone, "utcnow", lambda: self.now),
            mock.patch.object(af_trigger.time, "time", lambda: self.now.timestamp()),
        ]

    def __enter__(self) -> Clock:
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc) -> None:
        for patch in self._patches:
            patch.stop()


def ask(timetable, **kwargs) -> DagRunInfo | dict | None:
    """Airflow's answer, or {"error": its exception's type} when its timetable raises (its
    scheduler then logs it and gives the Dag no next run)."""
    try:
        return timetable.next_dagrun_info_v2(**kwargs)
    except Exception as exc:
        return {"error": type(exc).__name__}


def encode(info: DagRunInfo | dict | None) -> list | dict | None:
    if info is None or isinstance(info, dict):
        return info
    di = info.data_interval
    start = int(di.start.timestamp()) if di else None
    end = int(di.end.timestamp()) if di else None
    logical = int(info.logical_date.timestamp()) if info.logical_date else None
    return [logical, start, end, int(info.run_after.timestamp())]


def decode(run: list) -> DagRunInfo:
    def at(x):
        return pendulum.from_timestamp(x, tz="UTC") if x is not None else None

    di = DataInterval(at(run[1]), at(run[2])) if run[1] is not None else None
    return DagRunInfo(run_after=at(run[3]), data_interval=di)


def transitions(zone: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """UTC instants where the zone's offset changes (hour by hour, bisected to the minute)."""
    tz = ZoneInfo(zone)
    found, t = [], start
    step = dt.timedelta(hours=1)
    while t < end:
        if t.astimezone(tz).utcoffset() != (t + step).astimezone(tz).utcoffset():
            lo, hi = t, t + step
            while hi - lo > dt.timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(tz).utcoffset() == lo.astimezone(tz).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        t += step
    return found


def frequent(timetable, start: pendulum.DateTime, clock: Clock) -> bool:
    """Does the timetable tick more than 60 times in its first 10 days (more often than every
    4 hours)? Those walk windows around the transitions instead of two whole years."""
    clock.now = start - dt.timedelta(days=1)
    restriction = TimeRestriction(earliest=start, latest=None, catchup=True)
    last, horizon = None, start + dt.timedelta(days=10)
    for _ in range(61):
        last = ask(timetable, last_dagrun_info=last, restriction=restriction)
        if not isinstance(last, DagRunInfo) or last.run_after > horizon:
            return False
    return True


def make_case(spec, zone: str, clock: Clock) -> dict:
    timetable = airflow_timetable(spec, zone)
    start = local_to_utc(START, zone)
    end = local_to_utc(START.replace(year=START.year + YEARS), zone)
    span_start, span_end = start, end
    windows = [(start, start + dt.timedelta(days=2))]
    moments = transitions(zone, span_start, span_end)
    dense = frequent(timetable, start, clock)
    if dense:
        windows += [
            (
                pendulum.instance(m - dt.timedelta(days=1)),
                pendulum.instance(m + dt.timedelta(days=1)),
            )
            for m in moments
        ]
    else:
        windows = [(start, end)]
    series = []
    for w_start, w_end in windows:
        restriction = TimeRestriction(earliest=pendulum.instance(w_start), latest=end, catchup=True)
        clock.now = pendulum.instance(w_start) - dt.timedelta(days=1)
        runs, last = [], None
        while True:
            info = ask(timetable, last_dagrun_info=last, restriction=restriction)
            runs.append(encode(info))
            if not isinstance(info, DagRunInfo) or info.run_after > w_end:
                break
            last = info
        series.append(
            {"earliest": int(w_start.timestamp()), "latest": int(end.timestamp()), "runs": runs}
        )
    # Probes: "now"s over the two years and around each transition.
    nows = []
    t = span_start + dt.timedelta(minutes=7)
    while t < span_end:
        nows.append(t)
        t += dt.timedelta(hours=673)
    for m in moments:
        for k in range(-3, 4):
            nows.append(pendulum.instance(m + dt.timedelta(minutes=30 * k)))
    probes = []
    all_runs = [r for s in series for r in s["runs"] if isinstance(r, list)]
    for now in sorted(nows):
        clock.now = pendulum.instance(now)
        n = int(now.timestamp())
        due = [r for r in all_runs if r[3] <= n]
        lasts = [None]
        if due:
            lasts.append(due[-1])
            if len(due) > 3:
                lasts.append(due[-4])
        for last in lasts:
            variants = ((start, False), (None, False), (None, True)) if last is None else ()
            for earliest, catchup in variants or ((start, False),):
                restriction = TimeRestriction(earliest=earliest, latest=end, catchup=catchup)
                info = ask(
                    timetable,
                    last_dagrun_info=decode(last) if last else None,
                    restriction=restriction,
                )
                probes.append(
                    {
                        "now": n,
                        "last": last,
                        "catchup": catchup,
                        "earliest": int(earliest.timestamp()) if earliest else None,
                        "next": encode(info),
                    }
                )
    return {"timetable": spec, "timezone": zone, "series": series, "probes": probes}


SPECS = [
    *CRONS,
    *({"kind": "cron_data_interval", "cron": c} for c in DATA_INTERVAL_CRONS),
    *OTHERS,
]


def zone_cases(zone: str) -> int:
    """Write one zone's cases; return their number."""
    import airflow

    began = time.monotonic()
    with Clock() as clock:
        cases = [make_case(spec, zone, clock) for spec in [*SPECS, events_case(zone)]]
    corpus = {
        "airflow": airflow.__version__,
        "start": START.isoformat(),
        "years": YEARS,
        "timezone": zone,
        "cases": cases,
    }
    path = HERE / f"corpus-{zone.replace('/', '_')}.json.gz"
    write(path, compact(corpus))
    ticks = sum(len(s["runs"]) for c in cases for s in c["series"])
    probes = sum(len(c["probes"]) for c in cases)
    print(
        f"{zone}: {len(cases)} cases, {ticks} ticks, {probes} probes, "
        f"{time.monotonic() - began:.0f} s -> {path.name}",
        file=sys.stderr,
        flush=True,
    )
    return len(cases)


def _run(run: list | dict | None, base: int) -> list | dict | None:
    if not isinstance(run, list):
        return run
    logical, start, end, run_after = run
    if logical != start:
        raise ValueError(f"a logical date that is not its interval's start: {run}")
    if start is None:
        return [run_after - base, None, None]
    return [run_after - base, start - run_after, end - run_after]


def compact(corpus: dict) -> dict:
    """Format 1 (as `make_case` builds it) -> format 2 (the module docstring)."""
    cases = []
    for case in corpus["cases"]:
        series = []
        for one in case["series"]:
            base, runs = one["earliest"], []
            for run in one["runs"]:
                runs.append(_run(run, base))
                if isinstance(run, list):
                    base = run[3]
            series.append({"earliest": one["earliest"], "latest": one["latest"], "runs": runs})
        starts = {p["earliest"] for p in case["probes"]} - {None}
        if len(starts) > 1:
            raise ValueError("probes from more than one start date")
        rows, previous = [], 0
        for probe in case["probes"]:
            now = probe["now"]
            rows.append(
                [
                    now - previous,
                    _run(probe["last"], now),
                    int(probe["catchup"]),
                    int(probe["earliest"] is not None),
                    _run(probe["next"], now),
                ]
            )
            previous = now
        cases.append(
            {
                "timetable": case["timetable"],
                "timezone": case["timezone"],
                "start": starts.pop() if starts else None,
                "series": series,
                "probes": rows,
            }
        )
    return {**corpus, "format": 2, "cases": cases}


def write(path: Path, corpus: dict) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as out:
        json.dump(corpus, out, separators=(",", ":"))


def main() -> None:
    """`generate.py [PROCESSES] [ZONE...]`: the zones (default all) in parallel processes
    (default 3). `generate.py compact FILE...`: rewrite format-1 files as format 2."""
    import multiprocessing

    if sys.argv[1:2] == ["compact"]:
        for name in sys.argv[2:]:
            with gzip.open(name, "rt", encoding="utf-8") as f:
                corpus = json.load(f)
            if corpus.get("format", 1) == 1:
                write(Path(name), compact(corpus))
        return

    processes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    zones = sys.argv[2:] or ZONES
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        counts = pool.map(zone_cases, zones, chunksize=1)
    print(f"{len(SPECS) + 1} timetables, {sum(counts)} cases in {len(zones)} zones")


if __name__ == "__main__":
    main()
