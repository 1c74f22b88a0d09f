"""The worker API's run-time endpoints a task calls through the Task SDK (XComs, Variables,
Connections, rendered fields, reschedules, dag-run and TI reads), answered in the shapes of
task-sdk 1.3.2's own models (validated with them in the SDK's virtualenv), and JSON 404/405 for
anything else under /execution/."""

import json
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.db import connection as db
from django.utils import timezone

from assets_app.definitions import sync
from assets_app.models import (
    Connection,
    Dag,
    DagRun,
    DagRunType,
    RenderedTaskFields,
    TaskInstance,
    TaskReschedule,
    TIState,
    Variable,
    XCom,
)
from assets_app.runtime.variables import save_connection, value_of
from tests.compat.airflow_worker_env import validate_with_sdk
from tests.factories import DagFactory, DagRunFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

# (SDK model name, body) of every answer below, validated all at once when the module ends in
# this process (pytest-xdist may run its tests on several workers, each validates its own).
ANSWERS: list[tuple[str, object]] = []


# The first use of the SDK's virtualenv builds it (.ci/run builds it beforehand).
@pytest.fixture(scope="module", autouse=True)
def answers_validate_against_the_sdk_models():
    """Every answer collected by this module's tests in this process, through task-sdk 1.3.2's
    own models (extra fields are refused by most of them): a failure is an error at teardown."""
    yield
    if ANSWERS:
        assert validate_with_sdk(ANSWERS) == []


def _answer(model: str, response) -> object:
    body = json.loads(response.content)
    ANSWERS.append((model, body))
    return body


@pytest.fixture
def running():
    return TaskInstanceFactory(running=True, task_id="produce")


def _xcom(ti, key="return_value"):
    return f"/xcoms/{ti.dag_id}/{ti.run_id}/{ti.task_id}/{key}"


def test_xcom_push_pull_count_slice_item_delete(worker_api, running):
    ti = running
    pushed = worker_api.request("POST", _xcom(ti), {"rows": 3}, ti_id=ti.id)
    assert pushed.status_code == 201, pushed.content
    # A second push of the same key replaces the value: one row.
    worker_api.request("POST", _xcom(ti), {"rows": 4}, ti_id=ti.id)
    assert XCom.objects.get().value == {"rows": 4}

    got = worker_api.request("GET", _xcom(ti), ti_id=ti.id)
    assert _answer("XComResponse", got) == {"key": "return_value", "value": {"rows": 4}}
    head = worker_api.request("HEAD", _xcom(ti), ti_id=ti.id)
    assert head["Content-Range"] == "map_indexes 1"
    # Mapped values: each map index's TI pushes its own (a token writes only its own address).
    for index, value in ((0, "a"), (1, "b"), (2, "c")):
        mapped = TaskInstanceFactory(
            running=True, dag_run=ti.dag_run, task_id="produce", map_index=index
        )
        pushed = worker_api.request(
            "POST", f"{_xcom(ti, 'seq')}?map_index={index}", value, ti_id=mapped.id
        )
        assert pushed.status_code == 201, pushed.content
    assert _answer(
        "XComSequenceSliceResponse",
        worker_api.request("GET", f"{_xcom(ti, 'seq')}/slice", ti_id=ti.id, start=-2),
    ) == ["b", "c"]
    sliced = worker_api.request("GET", f"{_xcom(ti, 'seq')}/slice", ti_id=ti.id, step=-2)
    assert json.loads(sliced.content) == ["c", "a"]
    item = worker_api.request("GET", f"{_xcom(ti, 'seq')}/item/-1", ti_id=ti.id)
    assert _answer("XComSequenceIndexResponse", item) == "c"
    assert worker_api.request("GET", f"{_xcom(ti, 'seq')}/item/3", ti_id=ti.id).status_code == 404
    offset = worker_api.request("GET", _xcom(ti, "seq"), ti_id=ti.id, offset=1)
    assert json.loads(offset.content)["value"] == "b"

    deleted = worker_api.request("DELETE", _xcom(ti), ti_id=ti.id)
    assert deleted.status_code == 200
    missing = worker_api.request("GET", _xcom(ti), ti_id=ti.id)
    assert missing.status_code == 404
    assert json.loads(missing.content)["detail"]["reason"] == "not_found"


def test_xcom_push_for_another_run_is_403_and_writes_nothing(worker_api, running):
    path = f"/xcoms/{running.dag_id}/no_such_run/{running.task_id}/return_value"
    refused = worker_api.request("POST", path, 1, ti_id=running.id)
    assert refused.status_code == 403
    assert json.loads(refused.content)["detail"]["reason"] == "xcom_write_not_own"
    assert not XCom.objects.exists()


@pytest.mark.parametrize(("length", "status"), [(1024, 201), (1025, 400)])
def test_return_value_for_a_mapped_downstream_over_max_map_length_is_refused_as_airflow(
    worker_api, running, length, status
):
    """Airflow 3.3.2 `set_xcom`: the Task SDK sends `mapped_length=len(value)` with the return
    value of a task whose downstream is mapped; over `[core] max_map_length` (1,024) it is 400
    unmappable_return_value_length and nothing is stored; at the limit it is stored."""
    value = list(range(length))
    pushed = worker_api.request(
        "POST", f"{_xcom(running)}?mapped_length={length}", value, ti_id=running.id
    )
    assert pushed.status_code == status, pushed.content
    if status == 400:
        assert json.loads(pushed.content)["detail"]["reason"] == "unmappable_return_value_length"
        assert not XCom.objects.exists()
    else:
        assert XCom.objects.get().value == value


def test_retry_lists_the_keys_of_the_earlier_try_to_clear(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=1)
    worker_api.request("POST", _xcom(ti), "first try", ti_id=ti.id)
    worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/state",
        {"state": "up_for_retry", "end_date": timezone.now().isoformat(), "retry_delay_seconds": 0},
        ti_id=ti.id,
    )
    start = worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/run",
        {
            "state": "running",
            "hostname": "h",
            "unixname": "u",
            "pid": 7,
            "start_date": "2026-06-30T10:00:00Z",
        },
        ti_id=ti.id,
    )
    context = _answer("TIRunContext", start)
    assert context["xcom_keys_to_clear"] == ["return_value"]


def test_variables_get_put_delete(worker_api, running):
    path = "/variables/warehouse/bucket"
    assert worker_api.request("GET", path, ti_id=running.id).status_code == 404
    put = worker_api.request("PUT", path, {"val": "s3://b", "description": "d"}, ti_id=running.id)
    assert put.status_code == 201
    assert value_of(Variable.objects.get(key="warehouse/bucket")) == "s3://b"
    got = worker_api.request("GET", path, ti_id=running.id)
    assert _answer("VariableResponse", got) == {"key": "warehouse/bucket", "value": "s3://b"}
    keys = worker_api.request("GET", "/variables/keys", ti_id=running.id, prefix="ware")
    assert _answer("VariableKeysResponse", keys) == {
        "keys": ["warehouse/bucket"],
        "total_entries": 1,
    }
    assert worker_api.request("DELETE", path, ti_id=running.id).status_code == 204
    assert not Variable.objects.exists()


def test_connection_is_encrypted_at_rest_and_served_in_clear(worker_api, running):
    save_connection(
        conn_id="db",
        create=True,
        conn_type="postgres",
        host="h",
        schema="s",
        login="l",
        port=5432,
        password="hunter2",
        extra='{"sslmode": "require"}',
    )
    with db.cursor() as cursor:
        cursor.execute("SELECT password, extra FROM assets_app_connection")
        stored = cursor.fetchone()
    assert "hunter2" not in stored[0] and "sslmode" not in stored[1]
    got = worker_api.request("GET", "/connections/db", ti_id=running.id)
    body = _answer("ConnectionResponse", got)
    assert body["password"] == "hunter2" and body["schema"] == "s"
    assert body["extra"] == '{"sslmode": "require"}'
    assert worker_api.request("GET", "/connections/nope", ti_id=running.id).status_code == 404


def test_connection_with_another_key_is_a_clear_503(worker_api, running, settings):
    save_connection(conn_id="db", create=True, conn_type="http", password="p")
    settings.FERNET_KEY = Fernet.generate_key().decode()
    got = worker_api.request("GET", "/connections/db", ti_id=running.id)
    assert got.status_code == 503
    assert "FERNET_KEY" in json.loads(got.content)["detail"]["message"]
    settings.FERNET_KEY = "not-a-key"
    assert worker_api.request("GET", "/connections/db", ti_id=running.id).status_code == 503
    assert Connection.objects.count() == 1


def test_rtif_validate_and_previous_successful_run(worker_api, running):
    ti = running
    put = worker_api.request("PUT", f"/task-instances/{ti.id}/rtif", {"op_args": "[]"}, ti_id=ti.id)
    assert put.status_code == 201
    assert RenderedTaskFields.objects.get(ti=ti).fields == {"op_args": "[]"}
    valid = worker_api.request(
        "GET", f"/task-instances/{ti.id}/validate-inlets-and-outlets", ti_id=ti.id
    )
    assert _answer("InactiveAssetsResponse", valid) == {"inactive_assets": []}
    prev = worker_api.request(
        "GET", f"/task-instances/{ti.id}/previous-successful-dagrun", ti_id=ti.id
    )
    assert _answer("PrevSuccessfulDagRunResponse", prev)["start_date"] is None


def test_validate_names_an_inactive_inlet_as_airflow_answers(worker_api):
    """Airflow's `example_inlet_event_extra` reads Asset("s3://output/1.txt") while
    `example_outlet_event_extra` produces Asset(name="test-asset", uri="s3://output/1.txt"):
    the reader's inlet is inactive, answered as an `AssetProfile` (the Task SDK then fails the
    task with AirflowInactiveAssetInInletOrOutletException); the producer's outlet is not."""
    uri = "s3://output/1.txt"
    documents = [
        {"dag_id": "producer", "tasks": [{"task_id": "t", "outlets": [{"name": "n", "uri": uri}]}]},
        {"dag_id": "reader", "tasks": [{"task_id": "t", "inlets": [uri]}]},
    ]
    sync.sync_documents(documents=[(f"{d['dag_id']}.py", d) for d in documents])
    answers = {}
    for dag_id in ("producer", "reader"):
        ti = TaskInstanceFactory(
            running=True, task_id="t", dag_run=DagRunFactory(dag=Dag.objects.get(dag_id=dag_id))
        )
        path = f"/task-instances/{ti.id}/validate-inlets-and-outlets"
        answers[dag_id] = _answer(
            "InactiveAssetsResponse", worker_api.request("GET", path, ti_id=ti.id)
        )
    assert answers == {
        "producer": {"inactive_assets": []},
        "reader": {"inactive_assets": [{"name": uri, "uri": uri, "type": "Asset"}]},
    }


def test_previous_successful_run_by_logical_date(worker_api):
    dag = DagFactory()
    now = timezone.now()
    old = DagRunFactory(
        dag=dag, logical_date=now - timedelta(days=1), state="success", start_date=now
    )
    ti = TaskInstanceFactory(running=True, dag_run=DagRunFactory(dag=dag, logical_date=now))
    prev = worker_api.request(
        "GET", f"/task-instances/{ti.id}/previous-successful-dagrun", ti_id=ti.id
    )
    assert json.loads(prev.content)["start_date"] is not None
    assert old.start_date is not None


def test_reschedule_requeues_at_the_date_and_keeps_the_first_start(worker_api, running):
    ti = running
    when = timezone.now() + timedelta(seconds=30)
    body = {
        "state": "up_for_reschedule",
        "reschedule_date": when.isoformat(),
        "end_date": timezone.now().isoformat(),
    }
    changed = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)
    assert changed.status_code == 204, changed.content
    ti.refresh_from_db()
    assert (ti.state, ti.try_number, ti.retry_at) == (TIState.QUEUED, 1, when)
    assert TaskReschedule.objects.get(ti=ti).try_number == 1
    again = worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)
    assert again.status_code == 409 and TaskReschedule.objects.count() == 1
    start = worker_api.request(
        "GET", f"/task-reschedules/{ti.id}/start_date", ti_id=ti.id, try_number=1
    )
    assert start.status_code == 200 and json.loads(start.content) is not None
    TaskInstance.objects.filter(id=ti.id).update(retry_at=None)
    run = worker_api.request(
        "PATCH",
        f"/task-instances/{ti.id}/run",
        {
            "state": "running",
            "hostname": "h",
            "unixname": "u",
            "pid": 7,
            "start_date": "2026-06-30T10:00:00Z",
        },
        ti_id=ti.id,
    )
    assert _answer("TIRunContext", run)["task_reschedule_count"] == 1


def test_task_instance_count_and_states(worker_api, running):
    other = TaskInstanceFactory(dag_run=running.dag_run, task_id="other", state=TIState.SUCCESS)
    count = worker_api.request(
        "GET",
        f"/task-instances/count?dag_id={running.dag_id}&states=success&states=running",
        ti_id=running.id,
    )
    assert json.loads(count.content) == 2
    one = worker_api.request(
        "GET", f"/task-instances/count?dag_id={running.dag_id}&task_ids=other", ti_id=running.id
    )
    assert json.loads(one.content) == 1
    states = worker_api.request(
        "GET", "/task-instances/states", ti_id=running.id, dag_id=running.dag_id
    )
    assert _answer("TaskStatesResponse", states) == {
        "task_states": {running.run_id: {"produce": "running", other.task_id: "success"}}
    }


def test_task_group_reads_answer_as_airflow(worker_api, running):
    """Reads by `task_group_id` (the ExternalTaskSensor's `get_task_states`, `get_ti_count`)
    as Airflow 3.3.2's routes answer them (`_get_group_tasks`): the group's TIs (nested
    groups' included), an unknown group or Dag a 404 with its body, an empty group no states
    and a count over the group id itself."""
    dag = running.dag_run.dag
    dag.task_groups = {"outer": ["outer.a", "outer.inner.b"], "outer.inner": ["outer.inner.b"]}
    dag.task_groups["empty"] = []
    dag.save()
    run = running.dag_run
    TaskInstanceFactory(dag_run=run, task_id="outer.a", state=TIState.SUCCESS)
    TaskInstanceFactory(dag_run=run, task_id="outer.inner.b", map_index=0, state=TIState.FAILED)
    TaskInstanceFactory(dag_run=run, task_id="outer.inner.b", map_index=1, state=TIState.SUCCESS)

    def get(path, **params):
        return worker_api.request("GET", path, ti_id=running.id, dag_id=dag.dag_id, **params)

    states = get("/task-instances/states", task_group_id="outer")
    assert _answer("TaskStatesResponse", states) == {
        "task_states": {
            run.run_id: {
                "outer.a": "success",
                "outer.inner.b_0": "failed",
                "outer.inner.b_1": "success",
            }
        }
    }
    both = get("/task-instances/states", task_group_id="outer.inner", task_ids=["produce"])
    assert _answer("TaskStatesResponse", both) == {
        "task_states": {
            run.run_id: {
                "produce": "running",
                "outer.inner.b_0": "failed",
                "outer.inner.b_1": "success",
            }
        }
    }
    assert json.loads(get("/task-instances/count", task_group_id="outer").content) == 3
    failed = get("/task-instances/count", task_group_id="outer", states=["failed", "skipped"])
    assert json.loads(failed.content) == 1
    empty = get("/task-instances/states", task_group_id="empty")
    assert _answer("TaskStatesResponse", empty) == {"task_states": {}}
    assert json.loads(get("/task-instances/count", task_group_id="empty").content) == 0
    for path in ("/task-instances/states", "/task-instances/count"):
        missing = get(path, task_group_id="parent_dag_task_group_id")
        assert (missing.status_code, json.loads(missing.content)) == (
            404,
            {
                "detail": {
                    "reason": "not_found",
                    "message": f"Task group parent_dag_task_group_id not found in DAG {dag.dag_id}",
                }
            },
        )
    no_dag = worker_api.request(
        "GET", "/task-instances/states", ti_id=running.id, dag_id="nope", task_group_id="g"
    )
    assert (no_dag.status_code, json.loads(no_dag.content)) == (
        404,
        {"detail": {"reason": "not_found", "message": "The Dag with ID: `nope` was not found"}},
    )


def test_dag_runs_state_count_trigger_clear(worker_api, running):
    run = running.dag_run
    state = worker_api.request(
        "GET", f"/dag-runs/{run.dag_id}/{run.run_id}/state", ti_id=running.id
    )
    assert _answer("DagRunStateResponse", state) == {"state": run.state}
    detail = worker_api.request("GET", f"/dag-runs/{run.dag_id}/{run.run_id}", ti_id=running.id)
    _answer("DagRun", detail)
    dag = worker_api.request("GET", f"/dags/{run.dag_id}", ti_id=running.id)
    assert _answer("DagResponse", dag)["dag_id"] == run.dag_id
    count = worker_api.request("GET", "/dag-runs/count", ti_id=running.id, dag_id=run.dag_id)
    assert json.loads(count.content) == 1

    target = DagFactory(dag_id="target")
    path = f"/dag-runs/{target.dag_id}/from_task"
    trig = worker_api.request("POST", path, {"conf": {"a": 1}}, ti_id=running.id)
    assert trig.status_code == 204, trig.content
    made = DagRun.objects.get(dag=target)
    assert (made.run_type, made.conf) == (DagRunType.OPERATOR_TRIGGERED, {"a": 1})
    again = worker_api.request("POST", path, {"conf": {}}, ti_id=running.id)
    assert again.status_code == 409
    assert DagRun.objects.filter(dag=target).count() == 1
    cleared = worker_api.request("POST", f"{path}/clear", ti_id=running.id)
    assert cleared.status_code == 204
    assert (
        worker_api.request("GET", "/dag-runs/target/nope/state", ti_id=running.id).status_code
        == 404
    )
    # A paused Dag's run is taken (TriggerDagRunOperator; Airflow's execution API does not look
    # at the pause) and waits, queued, for the unpause.
    DagFactory(dag_id="paused_target", paused=True)
    paused = worker_api.request("POST", "/dag-runs/paused_target/held", {}, ti_id=running.id)
    assert paused.status_code == 204, paused.content
    assert DagRun.objects.get(dag_id="paused_target").state == "queued"


def test_unknown_routes_and_methods_answer_json(worker_api, running):
    unknown = worker_api.request("GET", "/no/such/route", ti_id=running.id)
    assert unknown.status_code == 404
    assert json.loads(unknown.content)["detail"]["reason"] == "not_found"
    wrong = worker_api.request("DELETE", f"/task-instances/{running.id}/rtif", ti_id=running.id)
    assert wrong.status_code == 405
    assert json.loads(wrong.content)["detail"]["reason"] == "method_not_allowed"


def test_unstorable_parameters_are_422_not_500(worker_api, running):
    """What PostgreSQL cannot hold (found by the fuzz suite): a 16 h+ offset, a 64-bit index."""
    previous = worker_api.request(
        "GET",
        "/dag-runs/previous",
        ti_id=running.id,
        dag_id=running.dag_id,
        logical_date="0740-03-06T03:02:05-22:40",
    )
    assert previous.status_code == 422
    huge = worker_api.request("GET", _xcom(running), ti_id=running.id, map_index=2**40)
    assert huge.status_code == 422
