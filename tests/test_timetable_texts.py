"""The schedule texts the public API answers (`timetable_summary`, `timetable_description`,
`timetable_periodic`) equal Airflow 3.3.2's, on every timetable of the golden texts
(`tests/data/timetable_texts/`, produced by Airflow's own timetables and AssetOrTimeSchedule),
and the console's text adds the cron's time zone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from assets_app.definitions import timetables

CASES = json.loads((Path(__file__).parent / "data/timetable_texts/texts.json").read_text())


def _ours(case: dict) -> timetables.Timetable:
    return timetables.Timetable.from_spec(case["timetable"], timezone=case["timezone"])


def test_the_golden_texts_cover_the_corpus_and_every_kind():
    assert len(CASES) >= 150
    kinds = {_ours(case).kind for case in CASES}
    assert kinds == set(timetables.KINDS)


def test_summary_description_and_periodic_equal_airflows_on_every_case():
    differences = []
    for case in CASES:
        ours = _ours(case)
        got = {"summary": ours.summary, "description": ours.description, "periodic": ours.periodic}
        if got != case["airflow"]:
            differences.append((case["timetable"], case["timezone"], got, case["airflow"]))
    assert differences == [], differences[:5]


def test_asset_or_time_texts_equal_airflows_asset_or_time_schedule():
    differences = []
    for case in CASES:
        ours = _ours(case)
        summary, description = timetables.with_assets(
            timetables.ASSET_OR_TIME, ours.summary, ours.description
        )
        want = case["asset_or_time"]
        if (summary, description) != (want["summary"], want["description"]):
            differences.append((case["timetable"], summary, description, want))
    assert differences == [], differences[:5]


@pytest.mark.parametrize(
    ("spec", "zone", "text"),
    [
        ("0 3 * * *", "Europe/Zurich", "At 03:00, Europe/Zurich"),
        ("@hourly", "UTC", "Every hour"),
        ("5 * * * *", "UTC", "At 5 minutes past the hour"),
        ({"kind": "delta_trigger", "delta": 21600}, "UTC", "Every 6 hours"),
        ({"kind": "delta_data_interval", "delta": 3600}, "UTC", "Every hour"),
        ("@once", "Asia/Kolkata", "Once, as soon as possible"),
    ],
)
def test_the_console_text_says_the_zone_of_a_cron_and_spells_a_delta(spec, zone, text):
    assert timetables.Timetable.from_spec(spec, timezone=zone).text == text
