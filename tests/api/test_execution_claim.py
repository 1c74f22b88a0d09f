"""POST /execution/workloads/claim: workers find queued work."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.api import auth
from assets_app.models import DEFAULT_POOL_NAME, Pool, TaskInstance, WorkerBundle
from assets_app.operations import bundles
from assets_app.task_state import claims
from tests.factories import (
    AssetAliasFactory,
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskFactory,
    TaskInstanceFactory,
)

from .snapshots import db_snapshot

pytestmark = pytest.mark.django_db


def claim(worker_api, body, key="dev-worker-api-key"):
    client = worker_api.client
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.post(
        "/execution/workloads/claim", data=body, content_type="application/json", headers=headers
    )


@pytest.fixture(autouse=True)
def _api_key(settings):
    settings.WORKER_API_KEY = "dev-worker-api-key"


def test_claim_returns_queued_tis_with_token_and_declared_outlets(worker_api):
    task = TaskFactory(task_id="build")
    task.outlet_assets.add(AssetFactory(name="report", uri="s3://bucket/report"))
    task.outlet_aliases.add(AssetAliasFactory(name="reports"))
    run = DagRunFactory(dag=task.dag)
    ti = TaskInstanceFactory(dag_run=run, task_id="build")

    response = claim(worker_api, {"hostname": "worker-1", "limit": 5})

    assert response.status_code == 200
    (workload,) = response.json()["workloads"]
    assert workload["ti"] == {
        "id": str(ti.id),
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": "build",
        "map_index": -1,
        "try_number": 1,
        "dag_version_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"dag:{ti.dag_id}")),
        "queue": "default",
        "pool_slots": 1,
        "priority_weight": 1,
    }
    assert workload["type"] == "ExecuteTask"
    assert workload["bundle_info"] == {"name": "dags-folder"}
    assert workload["log_path"] == (
        f"dag_id={ti.dag_id}/run_id={ti.run_id}/task_id=build/attempt=1.log"
    )
    assert workload["task_outlets"] == [
        {"name": "report", "uri": "s3://bucket/report", "type": "Asset"},
        {"name": "reports", "type": "AssetAlias"},
    ]
    assert auth.decode_token(workload["token"])["sub"] == str(ti.id)
    ti.refresh_from_db()
    assert ti.claimed_by == "worker-1"
    assert ti.claimed_at is not None


def test_claimed_tis_are_not_claimed_again_until_the_timeout(worker_api, settings):
    settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS = 300
    ti = TaskInstanceFactory()
    assert len(claim(worker_api, {"hostname": "a", "limit": 5}).json()["workloads"]) == 1
    assert claim(worker_api, {"hostname": "b", "limit": 5}).json()["workloads"] == []

    TaskInstance.objects.filter(id=ti.id).update(claimed_at=timezone.now() - timedelta(seconds=301))
    (again,) = claim(worker_api, {"hostname": "b", "limit": 5}).json()["workloads"]
    assert again["ti"]["id"] == str(ti.id)
    ti.refresh_from_db()
    assert ti.claimed_by == "b"


def test_claim_skips_running_and_retry_delayed_tis(worker_api):
    TaskInstanceFactory(running=True)
    TaskInstanceFactory(retry_at=timezone.now() + timedelta(minutes=5))
    due = TaskInstanceFactory(retry_at=timezone.now() - timedelta(seconds=1))

    workloads = claim(worker_api, {"hostname": "a", "limit": 5}).json()["workloads"]

    assert [w["ti"]["id"] for w in workloads] == [str(due.id)]


def test_claim_is_fifo_and_respects_limit(worker_api):
    now = timezone.now()
    tis = [TaskInstanceFactory(queued_at=now - timedelta(seconds=10 - i)) for i in range(4)]
    workloads = claim(worker_api, {"hostname": "a", "limit": 3}).json()["workloads"]
    assert [w["ti"]["id"] for w in workloads] == [str(ti.id) for ti in tis[:3]]


def test_claim_takes_the_heaviest_effective_weight_first(worker_api):
    """One claim slot: the heavier TI goes first even though it was queued later (Airflow's
    `-priority_weight` order); a TI whose task is gone weighs Airflow's default, 1."""
    run = DagRunFactory()
    light = TaskFactory(dag=run.dag, task_id="light", priority_weight_total=1)
    heavy = TaskFactory(dag=run.dag, task_id="heavy", priority_weight_total=5)
    now = timezone.now()
    first = TaskInstanceFactory(dag_run=run, task_id=light.task_id, queued_at=now)
    orphan = TaskInstanceFactory(dag_run=run, task_id="gone", queued_at=now + timedelta(1))
    later = TaskInstanceFactory(
        dag_run=run, task_id=heavy.task_id, queued_at=now + timedelta(seconds=5)
    )

    got = [claim(worker_api, {"hostname": "a", "limit": 1}).json()["workloads"] for _ in range(3)]

    assert [w[0]["ti"]["id"] for w in got] == [str(later.id), str(first.id), str(orphan.id)]
    assert got[0][0]["ti"]["priority_weight"] == 5


def test_equal_weights_go_by_logical_date_then_map_index(worker_api):
    """Airflow's tie-break: the run's logical date (a run without one last), then map index."""
    dag = DagFactory()
    now = timezone.now()
    undated = DagRunFactory(dag=dag, logical_date=None)
    old = DagRunFactory(dag=dag, logical_date=now - timedelta(days=2))
    new = DagRunFactory(dag=dag, logical_date=now - timedelta(days=1))
    order = [
        TaskInstanceFactory(dag_run=old, task_id="m", map_index=0, queued_at=now),
        TaskInstanceFactory(dag_run=old, task_id="m", map_index=1, queued_at=now - timedelta(1)),
        TaskInstanceFactory(dag_run=new, task_id="t", queued_at=now - timedelta(2)),
        TaskInstanceFactory(dag_run=undated, task_id="t", queued_at=now - timedelta(3)),
    ]
    workloads = claim(worker_api, {"hostname": "a", "limit": 10}).json()["workloads"]
    assert [w["ti"]["id"] for w in workloads] == [str(ti.id) for ti in order]


def test_a_claim_takes_only_its_queues_default_airflows_default_queue(worker_api):
    """Airflow's task `queue`: a worker takes only the queues it listens on; without any, the
    `[operators] default_queue`, "default" (a TI whose task is gone is in it)."""
    run = DagRunFactory()
    gpu = TaskFactory(dag=run.dag, task_id="train", queue="gpu")
    plain = TaskFactory(dag=run.dag, task_id="load")
    now = timezone.now()
    on_gpu = TaskInstanceFactory(dag_run=run, task_id=gpu.task_id, queued_at=now)
    on_default = TaskInstanceFactory(dag_run=run, task_id=plain.task_id, queued_at=now)

    default = claim(worker_api, {"hostname": "a", "limit": 5}).json()["workloads"]
    assert [(w["ti"]["id"], w["ti"]["queue"]) for w in default] == [(str(on_default.id), "default")]
    assert claim(worker_api, {"hostname": "a", "limit": 5, "queues": ["cpu"]}).json() == {
        "workloads": []
    }
    got = claim(worker_api, {"hostname": "b", "limit": 5, "queues": ["cpu", "gpu"]}).json()
    assert [(w["ti"]["id"], w["ti"]["queue"]) for w in got["workloads"]] == [
        (str(on_gpu.id), "gpu")
    ]


@pytest.mark.parametrize(
    ("key", "status", "reason"),
    [(None, 401, "not_authenticated"), ("wrong", 403, "invalid_api_key")],
)
def test_claim_needs_the_worker_api_key(worker_api, key, status, reason):
    TaskInstanceFactory()
    before = db_snapshot()
    response = claim(worker_api, {"hostname": "a", "limit": 1}, key=key)
    assert response.status_code == status
    assert response.json()["detail"]["reason"] == reason
    assert db_snapshot() == before


def test_a_task_token_is_not_a_worker_api_key(worker_api):
    ti = TaskInstanceFactory()
    response = claim(
        worker_api,
        {"hostname": "a", "limit": 1},
        key=auth.issue_token(ti.id, try_number=ti.try_number),
    )
    assert response.status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {"hostname": "a", "limit": 0},
        {"hostname": "a", "limit": 1001},
        {"limit": 1},
        {},
        {"hostname": "a", "queues": []},
        {"hostname": "a", "queues": [""]},
        {"hostname": "a", "queues": "default"},
        {"hostname": "a", "bundles": []},
        {"hostname": "a", "bundles": ["two words"]},
    ],
)
def test_invalid_claim_body_is_422(worker_api, body):
    TaskInstanceFactory()
    before = db_snapshot()
    assert claim(worker_api, body).status_code == 422
    assert db_snapshot() == before


def _claim_queries(limit: int) -> int:
    with CaptureQueriesContext(connection) as ctx:
        workloads = claims.claim_workloads(hostname="w", limit=limit)
    assert len(workloads) == limit
    return len(ctx.captured_queries)


def test_claim_query_count_is_the_same_for_1_and_200_workloads():
    # default_pool's 128 slots and Airflow's max_active_tasks of 16 per run would stop the
    # second claim short of 199.
    Pool.objects.filter(name=DEFAULT_POOL_NAME).update(slots=-1)
    run = DagRunFactory(dag__max_active_tasks=1000)
    for i in range(200):
        task = TaskFactory(dag=run.dag, task_id=f"t{i}")
        task.outlet_assets.add(AssetFactory(name=f"a{i}"))
        TaskInstanceFactory(dag_run=run, task_id=f"t{i}")
    assert _claim_queries(1) == _claim_queries(199)


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_hand_out_the_same_ti():
    run = DagRunFactory(dag__max_active_tasks=100)
    ids = {TaskInstanceFactory(dag_run=run).id for _ in range(60)}
    results: list[list] = []
    barrier = threading.Barrier(4)

    def worker(name: str) -> None:
        try:
            barrier.wait()
            got = []
            while batch := claims.claim_workloads(hostname=name, limit=4):
                got.extend(w.ti.id for w in batch)
            results.append(got)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    claimed = [ti_id for got in results for ti_id in got]
    assert len(claimed) == 60
    assert set(claimed) == ids


@pytest.mark.timeout(900)  # the first use of the SDK's virtualenv builds it
def test_claimed_workload_is_airflow_core_execute_task(worker_api):
    """airflow-core 3.3.2's own `ExecuteTask` model (what `execute_workload` reads) accepts
    each claimed workload as it is, our extra `task_outlets` included."""
    from tests.compat.airflow_worker_env import validate_with_sdk

    dag = DagFactory(fileloc="producer.py")
    TaskInstanceFactory(dag_run=DagRunFactory(dag=dag), task_id="build")
    (workload,) = claim(worker_api, {"hostname": "worker-1", "limit": 5}).json()["workloads"]
    assert workload["dag_rel_path"] == "producer.py"
    assert validate_with_sdk([("ExecuteTask", workload)]) == []


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_reads_fail_leaves_its_tis_claimable(monkeypatch):
    """The database going away after the claim UPDATE (seen in the db-full proof: a 503 whose
    claim had committed stranded 2 TIs for the 300 s claim timeout) must roll the claim back."""
    ti = TaskInstanceFactory()

    def gone(keys):
        raise RuntimeError("database went away")

    monkeypatch.setattr(claims, "_declared_outlets", gone)
    with pytest.raises(RuntimeError):
        claims.claim_workloads(hostname="w1", limit=1)
    monkeypatch.undo()
    assert not TaskInstance.objects.get(id=ti.id).claimed_by
    assert [w.ti.id for w in claims.claim_workloads(hostname="w2", limit=1)] == [ti.id]


@pytest.mark.parametrize(
    "stored", ["/etc/passwd.py", "../outside.py", "dags/../../x.py", "C:evil.py", "a\\b.py"]
)
def test_a_stored_fileloc_outside_the_bundle_is_not_handed_to_a_worker(worker_api, stored):
    """Issue 38: a fileloc stored before the path rule (`definitions.sync.check_fileloc`) was
    handed to workers as `dag_rel_path`, which the Task SDK loads: it is checked at claim time
    too, and a bad one is handed as "" (no file to load)."""
    dag = DagFactory(fileloc=stored)
    TaskInstanceFactory(dag_run=DagRunFactory(dag=dag), task_id="build")
    (workload,) = claim(worker_api, {"hostname": "worker-1", "limit": 5}).json()["workloads"]
    assert workload["dag_rel_path"] == ""


def test_a_worker_claims_only_the_tis_of_the_bundles_it_serves(worker_api):
    """Issue 44: a worker naming its Dag bundles never claims a TI of a Dag of another bundle
    or of a JSON definition (it could not load the file: "Dag not found during start up", for
    ever); a claim naming none (the reference worker) still takes any. Each workload names its
    Dag's bundle, and the claim records that a worker serves the bundles it named."""
    mine = TaskInstanceFactory(dag_run__dag__bundle_name="team-a")
    theirs = TaskInstanceFactory(dag_run__dag__bundle_name="team-b")
    json_defined = TaskInstanceFactory()  # bundle_name None
    assert json_defined.dag_run.dag.bundle_name is None
    body = {"hostname": "w-a", "limit": 10, "bundles": ["team-a"]}

    got = claim(worker_api, body).json()["workloads"]
    assert [(w["ti"]["id"], w["bundle_info"]) for w in got] == [(str(mine.id), {"name": "team-a"})]
    assert claim(worker_api, body).json() == {"workloads": []}  # and again, never theirs
    assert WorkerBundle.objects.get().bundle_name == "team-a"
    assert WorkerBundle.objects.get().last_hostname == "w-a"
    both = claim(worker_api, {"hostname": "w-b", "limit": 10, "bundles": ["team-b", "x"]})
    assert [w["ti"]["id"] for w in both.json()["workloads"]] == [str(theirs.id)]
    anything = claim(worker_api, {"hostname": "ref", "limit": 10}).json()["workloads"]
    assert [w["ti"]["id"] for w in anything] == [str(json_defined.id)]
    assert anything[0]["bundle_info"] == {"name": "dags-folder"}


def test_a_bundle_is_recorded_at_most_once_per_seen_every(worker_api):
    """Idle workers poll every second: a bundle's row is rewritten once per SEEN_EVERY."""
    start = timezone.now()
    bundles.record_claim(hostname="a", bundles=["b1", "b1"], now=start)
    bundles.record_claim(hostname="b", bundles=["b1"], now=start + timedelta(seconds=5))
    seen = WorkerBundle.objects.get()
    assert (seen.last_claim_at, seen.last_hostname) == (start, "a")
    later = start + bundles.SEEN_EVERY + timedelta(seconds=1)
    bundles.record_claim(hostname="b", bundles=["b1"], now=later)
    seen = WorkerBundle.objects.get()
    assert (seen.last_claim_at, seen.last_hostname) == (later, "b")


def test_a_bundle_claim_has_the_same_query_count_for_1_and_200_workloads():
    Pool.objects.filter(name=DEFAULT_POOL_NAME).update(slots=-1)
    run = DagRunFactory(dag__max_active_tasks=1000, dag__bundle_name="team-a")
    for i in range(200):
        TaskFactory(dag=run.dag, task_id=f"t{i}")
        TaskInstanceFactory(dag_run=run, task_id=f"t{i}")

    def queries(limit: int) -> int:
        with CaptureQueriesContext(connection) as ctx:
            got = claims.claim_workloads(hostname="w", limit=limit, bundles=["team-a"])
        assert len(got) == limit
        return len(ctx.captured_queries)

    assert queries(1) == queries(199)
