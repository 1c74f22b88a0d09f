"""The golden corpus (issue 24's first acceptance item): our next-run computation gives
Airflow 3.3.2's own answers, 0 differences over every case.

`tests/data/timetables/corpus-<zone>.json.gz` were written by `generate.py` beside them,
which drives Airflow's timetables as its scheduler calls them (its docstring says what a case
holds and how it is stored). One test per case (a timetable in one zone) rebuilds the timetable
from the same definition (`Timetable.from_spec`, the mapping `sync_dags` uses), replays every
call (the catchup series, each run asked from Airflow's previous one, and every probe at its
"now") and compares the whole list of answers with Airflow's in one go; a failure shows the
first differences with the zone's local reading. No database: pure computation.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from assets_app.definitions.timetables import Restriction, RunInfo, Timetable, TimetableError

CORPUS = Path(__file__).parent / "data" / "timetables"
UTC = dt.UTC
ZONES = {
    "America/New_York",
    "Europe/Zurich",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "America/Santiago",
}

Run = list | str | None  # [logical, start, end, run_after] in epoch seconds, "error", or None


def expand_run(run: list | dict | None, base: int) -> Run:
    """A stored run (generate.py's format 2) back as [logical, start, end, run_after]; a
    timetable that raised is "error"."""
    if isinstance(run, dict):
        return "error"
    if run is None:
        return None
    run_after = base + run[0]
    if run[1] is None:
        return [None, None, None, run_after]
    start = run_after + run[1]
    return [start, start, run_after + run[2], run_after]


@cache
def zone_file(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        corpus = json.load(f)
    assert corpus.get("format") == 2, f"{path.name}: run generate.py compact on it"
    return corpus


def files() -> list[Path]:
    return sorted(CORPUS.glob("corpus-*.json.gz"))


def case_id(case: dict) -> str:
    spec = case["timetable"]
    name = (
        spec
        if isinstance(spec, str)
        else "-".join(str(v) for k, v in spec.items() if k not in ("event_dates", "timezone"))
    )
    return f"{case['timezone']}:{name}"


CASES = [(path, index) for path in files() for index in range(len(zone_file(path)["cases"]))]


def at(seconds: int | None) -> dt.datetime | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, tz=UTC)


def encode(info: RunInfo | None) -> Run:
    if info is None:
        return None

    def s(value: dt.datetime | None) -> int | None:
        return None if value is None else int(value.timestamp())

    return [
        s(info.logical_date),
        s(info.data_interval_start),
        s(info.data_interval_end),
        s(info.run_after),
    ]


def decode(run: list) -> RunInfo:
    return RunInfo(
        run_after=at(run[3]),  # type: ignore[arg-type]
        data_interval_start=at(run[1]),
        data_interval_end=at(run[2]),
    )


def ours(timetable: Timetable, **kwargs) -> Run:
    try:
        return encode(timetable.next_run(**kwargs))
    except TimetableError:
        return "error"


def show(run: Run, zone: str) -> str:
    if not isinstance(run, list):
        return str(run)
    tz = ZoneInfo(zone)
    return (
        "[" + ", ".join("-" if x is None else at(x).astimezone(tz).isoformat() for x in run) + "]"
    )


def replay(case: dict) -> tuple[list[tuple[tuple, Run]], list[Run]]:
    """Airflow's answers (each with the call it answers, for `label`) and ours, call by
    call."""
    zone = case["timezone"]
    timetable = Timetable.from_spec(case["timetable"], timezone=zone)
    theirs: list[tuple[tuple, Run]] = []
    got: list[Run] = []
    for series in case["series"]:
        restriction = Restriction(
            earliest=at(series["earliest"]), latest=at(series["latest"]), catchup=True
        )
        now = at(series["earliest"]) - dt.timedelta(days=1)  # type: ignore[operator]
        last, base = None, series["earliest"]
        for index, stored in enumerate(series["runs"]):
            expected = expand_run(stored, base)
            theirs.append((("series", series["earliest"], index), expected))
            got.append(ours(timetable, last=last, restriction=restriction, now=now))
            if isinstance(expected, list):
                last, base = decode(expected), expected[3]
    latest = at(case["series"][0]["latest"])
    now_s = 0
    for delta, last_s, catchup, from_start, next_s in case["probes"]:
        now_s += delta
        last = expand_run(last_s, now_s)
        expected = expand_run(next_s, now_s)
        restriction = Restriction(
            earliest=at(case["start"]) if from_start else None,
            latest=latest,
            catchup=bool(catchup),
        )
        theirs.append((("probe", now_s, catchup, from_start, last), expected))
        got.append(
            ours(
                timetable,
                last=decode(last) if isinstance(last, list) else None,
                restriction=restriction,
                now=at(now_s),  # type: ignore[arg-type]
            )
        )
    return theirs, got


def label(call: tuple, zone: str) -> str:
    if call[0] == "series":
        return f"series from {show([call[1]], zone)} run {call[2]}"
    _, now, catchup, from_start, last = call
    return (
        f"probe now={show([now], zone)} catchup={bool(catchup)} earliest={bool(from_start)} "
        f"last={show(last, zone)}"
    )


def test_the_corpus_is_the_issues_size():
    corpora = [zone_file(path) for path in files()]
    assert {c["airflow"] for c in corpora} == {"3.3.2"}
    assert {c["timezone"] for c in corpora} == ZONES
    crons = set()
    for corpus in corpora:
        cases = corpus["cases"]
        assert len({json.dumps(c["timetable"], sort_keys=True) for c in cases}) >= 50
        crons |= {c["timetable"] for c in cases if isinstance(c["timetable"], str)}
        assert corpus["years"] == 2
        # Catchup on (the series, and probes) and off (probes).
        assert {p[2] for c in cases for p in c["probes"]} == {0, 1}
    assert len(crons) >= 50


@pytest.mark.parametrize(
    ("path", "index"), CASES, ids=[case_id(zone_file(p)["cases"][i]) for p, i in CASES]
)
def test_no_difference_from_airflow(path, index):
    case = zone_file(path)["cases"][index]
    theirs, got = replay(case)
    if got != [answer for _, answer in theirs]:
        zone = case["timezone"]
        found = [
            f"{label(call, zone)}: ours {show(mine, zone)} Airflow {show(answer, zone)}"
            for (call, answer), mine in zip(theirs, got, strict=True)
            if mine != answer
        ]
        pytest.fail(
            f"{len(found)} differences of {len(got)} answers, first:\n" + "\n".join(found[:5])
        )
