"""Regenerate the golden schedule texts from Airflow 3.3.2's own timetables.

Run with the Airflow virtualenv's python (bin/airflow-worker builds it):

    .venv-airflow-worker/bin/python tests/data/timetable_texts/generate.py

It writes `texts.json` beside this file: for every timetable of the time-schedule corpus
(`tests/data/timetables/generate.py`'s SPECS, built by its `airflow_timetable`), an events
timetable with its dates in the Dag's zone, and each of them wrapped in AssetOrTimeSchedule,
the `summary`, `description` and `periodic` that Airflow gives (the public API's
`timetable_summary`, `timetable_description` and `timetable_periodic`).
`tests/test_timetable_texts.py` holds the service's texts to it.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pendulum
from airflow.serialization.definitions.assets import SerializedAsset
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.events import EventsTimetable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "timetables"))
from generate import SPECS, airflow_timetable  # noqa: E402

ZONES = ["UTC", "Europe/Zurich", "America/New_York"]
EVENTS = [
    {"kind": "events", "event_dates": ["2026-03-29T02:30:00", "2026-01-05T10:00:00"]},
    {"kind": "events", "event_dates": ["2026-06-01T00:00:00"], "description": "Board meetings"},
    {"kind": "events", "event_dates": []},
]


def events(spec: dict, zone: str) -> EventsTimetable:
    """As a DAG author writes them: pendulum dates in the Dag's zone."""
    tz = pendulum.timezone(zone)
    dates = [
        pendulum.instance(tz.convert(dt.datetime.fromisoformat(d).replace(fold=1)))
        for d in spec["event_dates"]
    ]
    return EventsTimetable(dates, description=spec.get("description"))


def texts(timetable) -> dict:
    return {
        "summary": timetable.summary,
        "description": timetable.description,
        "periodic": timetable.periodic,
    }


def main() -> None:
    asset = SerializedAsset(name="a", uri="a", group="asset", extra={}, watchers=[])
    cases = []
    for zone in ZONES:
        for spec in [*SPECS, *EVENTS]:
            if isinstance(spec, dict) and spec["kind"] == "events":
                timetable = events(spec, zone)
            else:
                timetable = airflow_timetable(spec, zone)
            both = AssetOrTimeSchedule(timetable=timetable, assets=[asset])
            cases.append(
                {
                    "timetable": spec,
                    "timezone": zone,
                    "airflow": texts(timetable),
                    "asset_or_time": texts(both),
                }
            )
    (HERE / "texts.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
