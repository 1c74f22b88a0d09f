"""The golden corpus (issue 24's first acceptance item): our next-run computation gives
Airflow 3.3.2's own answers, 0 differences over every case.

`tests/data/timetables/corpus-<zone>.json.gz` were written by `generate.py` beside them,
which drives Airflow's timetables as its scheduler calls them (its docstring says what a case
holds).
Each case here rebuilds the timetable from the same definition (`Timetable.from_spec`, the
mapping `sync_dags` uses) and replays every call: the catchup series run by run from the
previous answer, and every probe at its "now". All differences of a case are collected and
the first few shown, with the time zone's local reading, so a failure says where it differs.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from assets_app.timetables import Restriction, RunInfo, Timetable, TimetableError

CORPUS = Path(__file__).parent / "data" / "timetables"
UTC = dt.UTC


@cache
def corpus() -> dict:
    """Every zone's file (`corpus-<zone>.json.gz`) as one corpus."""
    cases, versions = [], set()
    for path in sorted(CORPUS.glob("corpus-*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            part = json.load(f)
        versions.add(part["airflow"])
        cases += part["cases"]
    return {"airflow": versions.pop() if len(versions) == 1 else versions, "cases": cases}


def at(seconds: int | None) -> dt.datetime | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, tz=UTC)


def ours(timetable: Timetable, **kwargs) -> list | str | None:
    try:
        return encode(timetable.next_run(**kwargs))
    except TimetableError:
        return "error"


def theirs(answer: list | dict | None) -> list | str | None:
    """Airflow's answer; {"error": ...} where its timetable raised (its scheduler then logs it
    and gives the Dag no next run): ours must refuse too."""
    return "error" if isinstance(answer, dict) else answer


def encode(info: RunInfo | None) -> list | None:
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
        run_after=at(run[3]), data_interval_start=at(run[1]), data_interval_end=at(run[2])
    )


def show(run: list | str | None, zone: str) -> str:
    if not isinstance(run, list):
        return str(run)
    tz = ZoneInfo(zone)
    return (
        "[" + ", ".join("-" if x is None else at(x).astimezone(tz).isoformat() for x in run) + "]"
    )


def differences(case: dict) -> list[str]:
    zone = case["timezone"]
    timetable = Timetable.from_spec(case["timetable"], timezone=zone)
    found = []
    for series in case["series"]:
        restriction = Restriction(
            earliest=at(series["earliest"]), latest=at(series["latest"]), catchup=True
        )
        now = at(series["earliest"]) - dt.timedelta(days=1)
        last = None
        for index, expected in enumerate(series["runs"]):
            got = ours(timetable, last=last, restriction=restriction, now=now)
            expected = theirs(expected)
            if got != expected:
                found.append(
                    f"series from {show([series['earliest']], case['timezone'])} run "
                    f"{index}: ours {show(got, case['timezone'])} Airflow "
                    f"{show(expected, case['timezone'])}"
                )
                break  # the rest of this series follows from a wrong run
            if isinstance(expected, list):
                last = decode(expected)
    for probe in case["probes"]:
        restriction = Restriction(
            earliest=at(probe["earliest"]),
            latest=at(case["series"][0]["latest"]),
            catchup=probe["catchup"],
        )
        last = decode(probe["last"]) if probe["last"] else None
        got = ours(timetable, last=last, restriction=restriction, now=at(probe["now"]))
        if got != theirs(probe["next"]):
            found.append(
                f"probe now={show([probe['now']], zone)} catchup={probe['catchup']} "
                f"earliest={probe['earliest'] is not None} last={show(probe['last'], zone)}: "
                f"ours {show(got, zone)} Airflow {show(probe['next'], zone)}"
            )
    return found


def case_id(case: dict) -> str:
    spec = case["timetable"]
    name = (
        spec
        if isinstance(spec, str)
        else "-".join(
            str(v) for k, v in spec.items() if k not in ("event_dates", "timezone") or k == "kind"
        )
    )
    return f"{case['timezone']}:{name}"


def test_the_corpus_is_big_enough():
    data = corpus()
    assert data["airflow"] == "3.3.2"
    zones = {c["timezone"] for c in data["cases"]}
    # Committed so far: the three zones with the hardest DST rules (generate.py makes all six:
    # Asia/Kolkata, Pacific/Chatham and UTC are still to be generated and committed).
    assert {"America/New_York", "Europe/Zurich", "Australia/Lord_Howe"} <= zones
    for zone in zones:
        timetables = {
            json.dumps(c["timetable"], sort_keys=True)
            for c in data["cases"]
            if c["timezone"] == zone
        }
        assert len(timetables) >= 50, zone
    assert {p["catchup"] for c in data["cases"] for p in c["probes"]} == {True, False}


@pytest.mark.parametrize(
    "index", range(len(corpus()["cases"])), ids=[case_id(c) for c in corpus()["cases"]]
)
def test_no_difference_from_airflow(index):
    case = corpus()["cases"][index]
    found = differences(case)
    assert not found, f"{len(found)} differences, first: " + "\n".join(found[:5])
