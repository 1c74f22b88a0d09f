"""The Dag answers of time-scheduled Dags (issue 24) validate with Airflow 3.3.2's own response
models (`airflow.api_fastapi.core_api.datamodels.dags`, in the Airflow virtualenv), and their
schedule fields are the values Airflow's own timetables give (computed there, not copied)."""

import json
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.definitions import sync as definitions
from tests.compat.airflow_worker_env import sdk_python

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(600)]

_AIRFLOW = """
import json, sys
from airflow.api_fastapi.core_api.datamodels.dags import DAGDetailsResponse, DAGResponse
from airflow.serialization.definitions.assets import SerializedAsset
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable
import datetime
answers = json.load(sys.stdin)
failures = []
for name, body in answers["bodies"]:
    model = DAGDetailsResponse if name == "details" else DAGResponse
    try:
        model.model_validate(body)
    except Exception as exc:
        failures.append(f"{body['dag_id']} {name}: {exc}")
asset = SerializedAsset(name="a", uri="a", group="asset", extra={}, watchers=[])
zurich = CronTriggerTimetable("0 3 * * *", timezone="Europe/Zurich")
texts = {
    "cron": zurich,
    "delta": DeltaTriggerTimetable(datetime.timedelta(hours=6)),
    "either": AssetOrTimeSchedule(timetable=zurich, assets=[asset]),
}
print(json.dumps({
    "failures": failures,
    "texts": {k: [t.summary, t.description, t.periodic] for k, t in texts.items()},
}))
"""


def test_time_scheduled_dag_answers_validate_with_airflows_models_and_texts():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    zurich = {"timetable": "0 3 * * *", "timezone": "Europe/Zurich", "start_date": "2099-01-01"}
    documents = [
        {"dag_id": "cron", **zurich},
        {"dag_id": "delta", "timetable": {"kind": "delta_trigger", "delta": 21600}},
        {"dag_id": "either", "schedule": "a", **zurich},
        {"dag_id": "both", "schedule": "a", "schedule_mode": "asset_and_time", **zurich},
    ]
    definitions.sync_definitions(
        dags=[
            d
            for doc in documents
            for d in definitions.parse_document({"is_paused": False, **doc}, file="x.json")
        ]
    )
    bodies = []
    ours = {}
    for doc in documents:
        dag_id = doc["dag_id"]
        body = api.get(f"/api/v2/dags/{dag_id}").json()
        ours[dag_id] = [
            body["timetable_summary"],
            body["timetable_description"],
            body["timetable_periodic"],
        ]
        bodies += [["dag", body], ["details", api.get(f"/api/v2/dags/{dag_id}/details").json()]]
    bodies.append(["dag", api.get("/api/v2/dags").json()["dags"][0]])
    done = subprocess.run(
        [str(sdk_python()), "-c", _AIRFLOW],
        input=json.dumps({"bodies": bodies}),
        check=True,
        capture_output=True,
        text=True,
    )
    airflow = json.loads(done.stdout.strip().splitlines()[-1])
    assert airflow["failures"] == []
    for dag_id in ("cron", "delta", "either"):
        assert ours[dag_id] == airflow["texts"][dag_id], dag_id
    assert ours["both"][0] == "Asset and 0 3 * * *"
    assert all(body["next_dagrun_run_after"] for name, body in bodies[:8] if name == "dag")
