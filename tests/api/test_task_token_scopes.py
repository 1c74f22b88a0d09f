"""Task tokens are held to their task instance (issue 26, `assets_app/runtime/scopes.py`; beyond
Airflow 3.3.2, where any valid task token reads every Connection and writes any Dag's XComs until
it expires): XCom writes only at its own address, reads within its own run (and the runs whose
events it consumed) unless its Dag opens them (`xcom_read_scope`), no writes once its TI
finished, Connections only while it runs (and in the callbacks' overtime). Every refusal is a 403
naming the rule and writes nothing."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import Dag, DagRunAssetEvent, TaskInstance, Variable, XCom
from assets_app.runtime.variables import save_connection, set_variable, value_of
from tests.factories import AssetEventFactory, DagFactory, DagRunFactory, TaskInstanceFactory

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db


def _xcom(dag_id, run_id, task_id, key="return_value"):
    return f"/xcoms/{dag_id}/{run_id}/{task_id}/{key}"


def _refused(response, reason: str) -> str:
    assert response.status_code == 403, response.content
    detail = json.loads(response.content)["detail"]
    assert detail["reason"] == reason
    return detail["message"]


@pytest.fixture
def running():
    return TaskInstanceFactory(running=True, task_id="produce")


def test_a_token_writes_xcoms_only_at_its_own_address(worker_api, running):
    ti = running
    other_task = TaskInstanceFactory(running=True, dag_run=ti.dag_run, task_id="other")
    other_run = DagRunFactory(dag=ti.dag_run.dag)
    before = db_snapshot()
    for path, params in (
        (_xcom(ti.dag_id, ti.run_id, "other"), ""),  # another task of its run
        (_xcom(ti.dag_id, ti.run_id, ti.task_id), "?map_index=3"),  # another map index
        (_xcom(ti.dag_id, other_run.run_id, ti.task_id), ""),  # another run of its Dag
    ):
        message = _refused(
            worker_api.request("POST", path + params, {"x": 1}, ti_id=ti.id), "xcom_write_not_own"
        )
        assert "writes only its own task instance's XComs" in message
        _refused(worker_api.request("DELETE", path + params, ti_id=ti.id), "xcom_write_not_own")
    assert db_snapshot() == before
    # Its own address, and the other task with its own token: as before.
    own = worker_api.request("POST", _xcom(ti.dag_id, ti.run_id, ti.task_id), 1, ti_id=ti.id)
    assert own.status_code == 201
    path = _xcom(ti.dag_id, ti.run_id, "other")
    assert worker_api.request("POST", path, 2, ti_id=other_task.id).status_code == 201
    assert XCom.objects.count() == 2


def test_a_mapped_tis_token_writes_its_own_map_index(worker_api):
    ti = TaskInstanceFactory(running=True, task_id="mapped", map_index=2)
    path = _xcom(ti.dag_id, ti.run_id, "mapped")
    assert worker_api.request("POST", f"{path}?map_index=2", 1, ti_id=ti.id).status_code == 201
    _refused(worker_api.request("POST", path, 1, ti_id=ti.id), "xcom_write_not_own")


def test_reads_stay_in_the_tokens_run_unless_its_dag_opens_them(worker_api, running):
    ti = running
    XCom.objects.create(dag_id=ti.dag_id, run_id=ti.run_id, task_id="up", key="k", value=1)
    earlier = DagRunFactory(dag=ti.dag_run.dag)
    XCom.objects.create(dag_id=ti.dag_id, run_id=earlier.run_id, task_id="up", key="k", value=2)
    elsewhere = DagRunFactory()
    XCom.objects.create(
        dag_id=elsewhere.dag_id, run_id=elsewhere.run_id, task_id="up", key="k", value=3
    )
    own = worker_api.request("GET", _xcom(ti.dag_id, ti.run_id, "up", "k"), ti_id=ti.id)
    assert json.loads(own.content)["value"] == 1
    prior = _xcom(ti.dag_id, earlier.run_id, "up", "k")
    foreign = _xcom(elsewhere.dag_id, elsewhere.run_id, "up", "k")
    for suffix in ("", "/slice", "/item/0"):
        message = _refused(
            worker_api.request("GET", prior + suffix, ti_id=ti.id), "xcom_read_outside_scope"
        )
        assert "its xcom_read_scope is 'run'" in message
    assert worker_api.request("HEAD", prior, ti_id=ti.id).status_code == 403  # no body

    Dag.objects.filter(dag_id=ti.dag_id).update(xcom_read_scope="dag")
    assert json.loads(worker_api.request("GET", prior, ti_id=ti.id).content)["value"] == 2
    _refused(worker_api.request("GET", foreign, ti_id=ti.id), "xcom_read_outside_scope")

    Dag.objects.filter(dag_id=ti.dag_id).update(xcom_read_scope="all")
    assert json.loads(worker_api.request("GET", foreign, ti_id=ti.id).content)["value"] == 3


def test_a_consumer_reads_the_xcoms_of_the_runs_whose_events_it_consumed(worker_api, running):
    """Airflow's consumer pattern (`examples/airflow_dags/consumer.py`): `xcom_pull` of the run
    that wrote a triggering event, under the narrow default; another run of that producer stays
    closed."""
    ti = running
    producer, other = DagRunFactory(), DagRunFactory()
    other_of_producer = DagRunFactory(dag=producer.dag)
    for run, value in ((producer, "p"), (other, "o"), (other_of_producer, "q")):
        XCom.objects.create(
            dag_id=run.dag_id, run_id=run.run_id, task_id="up", key="k", value=value
        )
    event = AssetEventFactory(source_dag_id=producer.dag_id, source_run_id=producer.run_id)
    AssetEventFactory(source_dag_id=other.dag_id, source_run_id=other.run_id)  # not consumed
    DagRunAssetEvent.objects.create(dag_run=ti.dag_run, dag=ti.dag_run.dag, asset_event=event)
    path = _xcom(producer.dag_id, producer.run_id, "up", "k")
    assert json.loads(worker_api.request("GET", path, ti_id=ti.id).content)["value"] == "p"
    for run in (other, other_of_producer):
        path = _xcom(run.dag_id, run.run_id, "up", "k")
        _refused(worker_api.request("GET", path, ti_id=ti.id), "xcom_read_outside_scope")


def _finish(worker_api, ti, state="success"):
    body = {"state": state, "end_date": timezone.now().isoformat()}
    if state == "success":
        body.update(task_outlets=[], outlet_events=[])
    return worker_api.request("PATCH", f"/task-instances/{ti.id}/state", body, ti_id=ti.id)


def test_a_finished_tis_token_writes_nothing(worker_api, running):
    ti = running
    set_variable(key="v", value="kept")
    assert _finish(worker_api, ti).status_code == 204
    before = db_snapshot()
    own_xcom = _xcom(ti.dag_id, ti.run_id, ti.task_id)
    message = _refused(worker_api.request("POST", own_xcom, 1, ti_id=ti.id), "task_not_running")
    assert "writes only while its task instance runs" in message and "success" in message
    _refused(worker_api.request("DELETE", own_xcom, ti_id=ti.id), "task_not_running")
    _refused(
        worker_api.request("PUT", "/variables/v", {"val": "x"}, ti_id=ti.id), "task_not_running"
    )
    _refused(worker_api.request("DELETE", "/variables/v", ti_id=ti.id), "task_not_running")
    other = DagFactory(dag_id="other")
    trigger = worker_api.request(
        "POST", f"/dag-runs/{other.dag_id}/by_a_finished_task", {"conf": {}}, ti_id=ti.id
    )
    _refused(trigger, "task_not_running")
    clear = worker_api.request("POST", f"/dag-runs/{ti.dag_id}/{ti.run_id}/clear", ti_id=ti.id)
    _refused(clear, "task_not_running")
    # Its own state route as today: the replayed success is 200, any other change 409.
    assert _finish(worker_api, ti).status_code == 200
    assert _finish(worker_api, ti, "failed").status_code == 409
    assert db_snapshot() == before
    assert value_of(Variable.objects.get(key="v")) == "kept"
    # Reads still answer (a finished task's listeners may read what it wrote).
    assert worker_api.request("GET", "/variables/v", ti_id=ti.id).status_code == 200


def test_a_running_tis_token_still_writes_variables_and_triggers(worker_api, running):
    ok = worker_api.request("PUT", "/variables/v", {"val": "x"}, ti_id=running.id)
    assert ok.status_code == 201
    DagFactory(dag_id="downstream")
    triggered = worker_api.request(
        "POST", "/dag-runs/downstream/from_a_running_task", {"conf": {}}, ti_id=running.id
    )
    assert triggered.status_code == 204, triggered.content


def test_connections_are_read_only_by_a_running_tis_token(worker_api, running):
    save_connection(conn_id="db", create=True, conn_type="postgres", password="hunter2")
    assert worker_api.request("GET", "/connections/db", ti_id=running.id).status_code == 200
    # Claimed but not started (its worker has the token already): refused.
    queued = TaskInstanceFactory(dag_run=running.dag_run, task_id="later")
    message = _refused(
        worker_api.request("GET", "/connections/db", ti_id=queued.id),
        "connection_needs_running_task",
    )
    assert "only a running task instance's token reads Connections" in message
    # Finished: its callbacks (run after the state is reported) read within the overtime ...
    assert _finish(worker_api, running).status_code == 204
    assert worker_api.request("GET", "/connections/db", ti_id=running.id).status_code == 200
    # ... and not after it.
    TaskInstance.objects.filter(id=running.id).update(
        updated_at=timezone.now() - timedelta(seconds=21)
    )
    got = worker_api.request("GET", "/connections/db", ti_id=running.id)
    assert "hunter2" not in got.content.decode()
    _refused(got, "connection_needs_running_task")


def test_the_read_scope_is_a_dag_definition_field(tmp_path):
    path = tmp_path / "dags.json"
    path.write_text(
        json.dumps([{"dag_id": "wide", "xcom_read_scope": "dag"}, {"dag_id": "narrow"}])
    )
    definitions.sync_dags(paths=[path])
    scopes = dict(Dag.objects.values_list("dag_id", "xcom_read_scope"))
    assert scopes == {"wide": "dag", "narrow": "run"}
    path.write_text(json.dumps({"dag_id": "wide", "xcom_read_scope": "everything"}))
    with pytest.raises(definitions.DefinitionError, match="xcom_read_scope"):
        definitions.sync_dags(paths=[path])
    assert Dag.objects.get(dag_id="wide").xcom_read_scope == "dag"


def test_rendered_fields_are_written_only_while_running_or_in_the_overtime(worker_api, running):
    path = f"/task-instances/{running.id}/rtif"
    assert worker_api.request("PUT", path, {"a": "1"}, ti_id=running.id).status_code == 201
    # Finished: the Task SDK's finalize may overwrite them just after the success ...
    assert _finish(worker_api, running).status_code == 204
    assert worker_api.request("PUT", path, {"a": "2"}, ti_id=running.id).status_code == 201
    # ... and a token of a TI finished longer ago writes nothing.
    TaskInstance.objects.filter(id=running.id).update(
        updated_at=timezone.now() - timedelta(seconds=21)
    )
    before = db_snapshot()
    message = _refused(
        worker_api.request("PUT", path, {"a": "3"}, ti_id=running.id), "task_not_running"
    )
    assert "Rendered fields write refused" in message
    assert db_snapshot() == before
