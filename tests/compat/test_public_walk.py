"""The walk (issue 49's acceptance): every path and method of the pinned Airflow 3.3.2's public
API document (`v2-rest-api-generated.yaml`, `airflow_env.airflow_openapi`) is sent to the service
in-process, with an admin's API token, its path ids filled from one seeded database
(`tests/api/test_public_airflowctl.world` and a few rows more).

- No operation gets the service's own "no route" 404 (`reason` `not_found`) or its 405: a 404
  for a missing object, with Airflow's message, is an answer.
- Every 2xx JSON body validates against the schema the document gives that status
  (`airflow_env.airflow_response_problems`, the validator the answers test uses).
- `UNSERVED` names each operation still deliberately unserved, with why; the walk fails when one of
  them is served (remove it from the list), so the list can only shrink.

Reads go first, then writes, deletes last, so a delete does not turn the reads after it into 404s.
"""

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from assets_app.models import Asset, AuditEntry, Connection, DagRun, Pool, Variable
from assets_app.operations import audit
from tests.api.test_public_airflowctl import world
from tests.factories import AssetAliasFactory, AssetFactory, TaskInstanceFactory

from .airflow_env import airflow_openapi, airflow_response_problems

pytestmark = pytest.mark.django_db

RUNS = "/api/v2/dags/{dag_id}/dagRuns"
TI = RUNS + "/{dag_run_id}/taskInstances"
TASK = TI + "/{task_id}"

# Operations of Airflow's document this service does not serve yet, each with why; each must
# still be unserved (the list only shrinks).
UNSERVED: dict[tuple[str, str], str] = {
    ("post", "/api/v2/dags/{dag_id}/clearDagRuns"): "clearing several runs: not built yet",
    ("post", "/api/v2/dags/{dag_id}/clearPartitions"): "partitions: not modelled here",
    ("post", "/api/v2/dags/{dag_id}/clearTaskInstances"): "TI clearing: not built yet",
    ("patch", RUNS): "bulk run update: not built yet",
    ("patch", RUNS + "/{dag_run_id}/taskGroupInstances/{group_id}"): "group state: not built",
    (
        "patch",
        RUNS + "/{dag_run_id}/taskGroupInstances/{group_id}/dry_run",
    ): "group state: not built",
    ("patch", TI): "bulk TI update: not built yet",
    ("get", TASK + "/dependencies"): "TI dependencies: not built yet",
    ("get", TASK + "/{map_index}/dependencies"): "TI dependencies: not built yet",
    (
        "get",
        TASK + "/{map_index}/hitlDetails/tries/{try_number}",
    ): "HITL history per try: not built yet",
}

# Query parameters an operation needs to answer more than a 422.
QUERIES: dict[tuple[str, str], dict] = {
    ("get", "/api/v2/backfills"): {"dag_id": "daily"},
    ("get", RUNS + "/{dag_run_id}/wait"): {"interval": "1"},
}

# Bodies that reach a 2xx (the rest send `{}`: a 422 is an answer too).
WHEN = "2026-03-02T00:00:00Z"
BODIES: dict[tuple[str, str], object] = {
    ("post", "/api/v2/variables"): {"key": "walk_v", "value": "1"},
    ("post", "/api/v2/pools"): {"name": "walk_p", "slots": 2},
    ("post", "/api/v2/connections"): {"connection_id": "walk_c", "conn_type": "http"},
    ("patch", "/api/v2/variables/{variable_key}"): {"key": "v1", "value": "2"},
    ("patch", "/api/v2/pools/{pool_name}"): {"name": "p1", "slots": 3},
    ("patch", "/api/v2/connections/{connection_id}"): {"connection_id": "c1", "conn_type": "ftp"},
    ("patch", "/api/v2/dags"): {"is_paused": True},
    ("patch", "/api/v2/dags/{dag_id}"): {"is_paused": True},
    ("post", RUNS): {"logical_date": WHEN},
    ("post", "/api/v2/assets/events"): {"asset_id": 0},  # the seeded asset's id, filled in
    ("post", "/api/v2/backfills"): {"dag_id": "daily", "from_date": WHEN, "to_date": WHEN},
    ("post", "/api/v2/backfills/dry_run"): {"dag_id": "daily", "from_date": WHEN, "to_date": WHEN},
    ("patch", "/api/v2/variables"): {"actions": []},
    ("patch", "/api/v2/pools"): {"actions": []},
    ("patch", "/api/v2/connections"): {"actions": []},
}


def _seed() -> dict[str, str]:
    world()
    run = DagRun.objects.get(dag_id="daily", run_id="r1")
    TaskInstanceFactory(dag_run=run, task_id="extract", state="success")
    asset = AssetFactory(name="walk-asset", uri="s3://walk/asset")
    alias = AssetAliasFactory(name="walk-alias")
    Variable.objects.create(key="v1", val="1")
    Pool.objects.create(name="p1", slots=1)
    Connection.objects.create(conn_id="c1", conn_type="http")
    entry = audit.record(actor=None, action="walk", summary="seeded", dag_id="daily")
    return {
        "dag_id": "daily",
        "dag_run_id": "r1",
        "task_id": "extract",
        "map_index": "-1",
        "xcom_key": "return_value",
        "asset_id": str(asset.pk),
        "asset_alias_id": str(alias.pk),
        "variable_key": "v1",
        "pool_name": "p1",
        "connection_id": "c1",
        "event_log_id": str(entry.pk),
        "backfill_id": "1",
        "version_number": "1",
        "try_number": "1",
        "task_try_number": "1",
        "import_error_id": "1",
        "group_id": "group",
        "key": "k",
        "section": "core",
        "option": "dags_folder",
        "file_token": "token",
    }


def _order(operation: tuple[str, str]) -> int:
    return {"get": 0, "delete": 2}.get(operation[0], 1)


def _no_route(response, path: str = "") -> bool:
    """The service's own 404 (`errors.json_fallback`: "no route ...", or Django's HTML page),
    any 405, or a 422 on a path parameter Airflow's path does not have (another route took the
    request: a literal segment read as `{map_index}`)."""
    if response.status_code == 405:
        return True
    if response.status_code == 422 and isinstance(response.json().get("detail"), list):
        params = set(re.findall(r"\{(\w+)\}", path))
        return any(
            e.get("loc", [None])[0] == "path" and e["loc"][-1] not in params
            for e in response.json()["detail"]
        )
    if response.status_code != 404:
        return False
    if not response.get("Content-Type", "").startswith("application/json"):
        return True
    detail = response.json().get("detail")
    return isinstance(detail, dict) and str(detail.get("message", "")).startswith("no route ")


def _text(response) -> str:
    return "(streamed)" if response.streaming else response.content[:160].decode(errors="replace")


def _has_body(response) -> bool:
    return not response.streaming and bool(response.content)


def walk() -> tuple[list[str], list[str], list[str], list[tuple]]:
    """(operations answered "no route", unserved ones now served, schema problems, answers)."""
    get_user_model().objects.create_user("walker", password="pw", is_superuser=True)
    _, key = create_api_token(username="walker", name="walk")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    ids = _seed()
    BODIES[("post", "/api/v2/assets/events")] = {"asset_id": Asset.objects.get().pk}
    document = airflow_openapi()
    operations = sorted(
        ((method, path) for path, methods in document["paths"].items() for method in methods),
        key=_order,
    )
    missing, now_served, answers = [], [], []
    for method, path in operations:
        url = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], path)
        if method == "get":
            response = api.get(url, QUERIES.get((method, path), {}))
        else:
            body = BODIES.get((method, path), {})
            response = getattr(api, method)(url, body, content_type="application/json")
        unserved = _no_route(response, path)
        label = f"{method.upper()} {path} -> {response.status_code} {_text(response)}"
        if (method, path) in UNSERVED:
            if not unserved:
                now_served.append(label)
            continue
        if unserved:
            missing.append(label)
        json_body = response.get("Content-Type", "").startswith("application/json")
        if 200 <= response.status_code < 300 and json_body and _has_body(response):
            answers.append((method, path, response.status_code, response.json()))
    return missing, now_served, airflow_response_problems(answers), answers


def test_every_operation_of_airflows_document_is_served_and_answers_its_schema():
    missing, now_served, problems, answers = walk()
    assert missing == [], "answered with the service's own no-route 404 / 405"
    assert now_served == [], "served now, remove from UNSERVED:\n" + "\n".join(now_served)
    assert problems == []
    # The walk reaches 2xx answers, not only refusals (a floor, measured: see the report).
    assert len(answers) >= 60, len(answers)
    assert AuditEntry.objects.filter(action="walk").exists()


def test_the_walk_tells_a_missing_route_from_a_missing_object():
    """The check can fail: the service's own 404 and 405 are "no route"; Airflow's 404 for an
    object it does not have is not."""
    get_user_model().objects.create_user("walker", password="pw", is_superuser=True)
    _, key = create_api_token(username="walker", name="walk")
    api = Client(headers={"Authorization": f"Bearer {key}"})
    assert _no_route(api.get("/api/v2/no-such-route"))
    assert _no_route(api.delete("/api/v2/dags"))
    assert not _no_route(api.get("/api/v2/dags/nope"))
    assert not _no_route(api.get("/api/v2/eventLogs/12345"))
    # `dependencies` read as a map index by `.../{task_id}/{map_index}`: not its route.
    captured = api.get("/api/v2/dags/d/dagRuns/r/taskInstances/t/dependencies")
    assert _no_route(
        captured,
        "/api/v2/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/dependencies",
    )
