"""Pools (issue 39): a claim never hands out more slots than a pool has open, counted as
Airflow's `Pool.slots_stats` counts them, also under concurrent claimers; `/api/v2/pools`
with Airflow's shapes and its refusals."""

import json
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assets_app.api.public_auth import create_api_token
from assets_app.models import DEFAULT_POOL_NAME, AuditEntry, Pool, TaskInstance, TIState
from assets_app.sql import claims as claims_sql
from assets_app.task_state import claims
from tests.api.snapshots import db_snapshot
from tests.factories import DagFactory, DagRunFactory, TaskFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db


def queued(run, *, pool: str = DEFAULT_POOL_NAME, slots: int = 1, weight: int = 1, n: int = 1):
    """`n` queued TIs of one new task of `run`'s Dag in `pool`, oldest first."""
    task = TaskFactory(dag=run.dag, pool=pool, pool_slots=slots, priority_weight_total=weight)
    now = timezone.now()
    return [
        TaskInstanceFactory(
            dag_run=run, task_id=task.task_id, map_index=i, queued_at=now + timedelta(0, i)
        )
        for i in range(n)
    ]


def claimed_ids(limit: int = 100) -> list:
    return [w.ti.id for w in claims.claim_workloads(hostname="w", limit=limit)]


def test_default_pool_exists_with_airflows_128_slots():
    pool = Pool.objects.get(name=DEFAULT_POOL_NAME)
    assert (pool.slots, pool.description, pool.include_deferred) == (128, "Default pool", False)


def test_a_claim_takes_no_more_slots_than_the_pool_has_open():
    Pool.objects.create(name="small", slots=2)
    run = DagRunFactory()
    tis = queued(run, pool="small", n=5)
    assert claimed_ids() == [tis[0].id, tis[1].id]
    assert claimed_ids() == []  # both slots held by claims that have not expired
    TaskInstance.objects.filter(id=tis[0].id).update(state=TIState.SUCCESS)
    assert claimed_ids() == [tis[2].id]


def test_running_tis_hold_their_slots_and_an_expired_claim_frees_them(settings):
    Pool.objects.create(name="small", slots=2)
    run = DagRunFactory()
    tis = queued(run, pool="small", n=4)
    TaskInstance.objects.filter(id=tis[0].id).update(state=TIState.RUNNING)
    TaskInstance.objects.filter(id=tis[1].id).update(
        claimed_by="gone",
        claimed_at=timezone.now() - timedelta(seconds=settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS + 1),
    )
    # tis[1]'s claim expired: it is claimable again and holds nothing; tis[0] runs.
    assert claimed_ids() == [tis[1].id]
    assert claimed_ids() == []


def test_pool_slots_count_and_a_lighter_ti_fills_the_room_a_heavier_one_cannot():
    """Airflow: a TI needing more slots than are open is passed over; one after it that fits
    still goes ("we can execute tasks with lower priority if there's enough room"). Here that
    takes the next claim: one claim statement counts a TI that fits the open slots alone
    against those after it (`claims_sql.claim_task_instances`), the next one passes it over."""
    Pool.objects.create(name="p", slots=3)
    run = DagRunFactory()
    (big,) = queued(run, pool="p", slots=2, weight=10)
    queued(run, pool="p", slots=2, weight=5)
    (small,) = queued(run, pool="p", slots=1, weight=1)
    assert claimed_ids() == [big.id]
    assert claimed_ids() == [small.id]
    assert claimed_ids() == []


def test_a_ti_needing_more_slots_than_the_pool_has_is_never_claimed():
    Pool.objects.create(name="p", slots=1)
    run = DagRunFactory()
    queued(run, pool="p", slots=2)
    assert claimed_ids() == []


def test_an_unlimited_pool_and_pools_are_counted_apart():
    Pool.objects.create(name="all", slots=-1)
    Pool.objects.create(name="one", slots=1)
    run = DagRunFactory()
    many = queued(run, pool="all", slots=50, n=5)
    one = queued(run, pool="one", n=3)
    assert set(claimed_ids()) == {ti.id for ti in many} | {one[0].id}


def test_a_pool_that_does_not_exist_keeps_its_tis_unclaimed_until_it_is_created():
    """Airflow's scheduler: "Tasks using non-existent pool '%s' will not be scheduled"."""
    run = DagRunFactory()
    (ti,) = queued(run, pool="later")
    assert claimed_ids() == []
    Pool.objects.create(name="later", slots=1)
    assert claimed_ids() == [ti.id]


def test_the_claim_query_count_is_the_same_for_1_and_100_pools():
    run = DagRunFactory()
    for i in range(100):
        Pool.objects.create(name=f"p{i}", slots=1)
    queued(run, pool="p0")

    def count(**_):
        with CaptureQueriesContext(connection) as ctx:
            assert len(claims.claim_workloads(hostname="w", limit=100)) > 0
        return len(ctx.captured_queries)

    one = count()
    TaskInstance.objects.update(claimed_at=None, claimed_by="")
    for i in range(1, 100):
        queued(run, pool=f"p{i}")
    assert count() == one


def _claim_at_once(*, threads: int, tries: int, limit: int) -> list:
    """The TI ids `threads` threads claimed, starting together, `tries` claims each."""
    barrier = threading.Barrier(threads)
    got: list = []

    def claimer(name: str) -> None:
        try:
            barrier.wait()
            for _ in range(tries):
                got.extend(w.ti.id for w in claims.claim_workloads(hostname=name, limit=limit))
        finally:
            connection.close()

    running = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return got


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("slots", [1, 2])
def test_concurrent_claimers_never_hold_more_slots_than_the_pool_has(slots):
    """A pool of 4 slots, 20 queued TIs needing `slots` each, 8 threads claiming at once, each
    again and again: exactly 4 // slots TIs are claimed in all, whatever the interleaving. Then
    the claimed ones finish and the next round hands out exactly as many again."""
    Pool.objects.create(name="p", slots=4)
    run = DagRunFactory()
    queued(run, pool="p", slots=slots, n=20)
    for _round in range(2):
        got = _claim_at_once(threads=8, tries=3, limit=3)
        assert len(got) == len(set(got)) == 4 // slots
        TaskInstance.objects.filter(id__in=got).update(state=TIState.SUCCESS)


# --- a bounded claim: the candidate window and the starved ---------------------------------------


@pytest.mark.parametrize(
    "starved_by",
    ["pool", "max_active_tasks", "max_active_tis_per_dag", "max_active_tis_per_dagrun"],
)
def test_a_ti_behind_more_starved_candidates_than_a_window_holds_is_claimed(starved_by):
    """Five windows' worth of heavier TIs ahead of it are starved (their pool full, their run,
    task or task of the run at its limit): they take no place in the bounded set a claim
    statement examines (`claims_sql.candidate_window`), as Airflow's starvation filters come
    before its `.limit(max_tis)`, so the TI behind them is claimed."""
    ahead = 5 * claims_sql.candidate_window(1)
    Pool.objects.create(name="p", slots=1 if starved_by == "pool" else 1000)
    dag = DagFactory(max_active_tasks=1 if starved_by == "max_active_tasks" else 1000)
    one = {starved_by: 1} if starved_by.startswith("max_active_tis") else {}
    task = TaskFactory(dag=dag, pool="p", priority_weight_total=10, **one)
    run = DagRunFactory(dag=dag)
    TaskInstance.objects.bulk_create(
        TaskInstance(
            dag_run=run,
            dag_id=run.dag_id,
            run_id=run.run_id,
            task_id=task.task_id,
            map_index=i,
            state=TIState.RUNNING if i == 0 else TIState.QUEUED,
        )
        for i in range(ahead + 1)
    )
    (behind,) = queued(DagRunFactory(), weight=1)
    assert claimed_ids(limit=1) == [behind.id]
    assert claimed_ids() == []


def test_a_claim_goes_on_past_a_window_that_one_runs_limit_fills():
    """Every candidate of the first statement's window is of a run with one slot left: that
    statement claims one, and the claim goes on (the run now starved, Airflow's loop) to the
    next run's TIs, up to its limit, with one more statement."""
    first = DagRunFactory(dag=DagFactory(max_active_tasks=1))
    heavy = queued(first, weight=10, n=claims_sql.candidate_window(3) + 5)
    light = queued(DagRunFactory(), weight=1, n=3)
    with CaptureQueriesContext(connection) as ctx:
        got = claimed_ids(limit=3)
    assert got == [heavy[0].id, light[0].id, light[1].id]
    assert sum("AS claim_pool_slots" in q["sql"] for q in ctx.captured_queries) == 2
    assert claimed_ids() == [light[2].id]


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_going_past_full_windows_hold_each_runs_limit_exactly():
    """Six runs with one slot each (`max_active_tasks` 1), each with more TIs than a window
    of a claim of 2 holds, in order run after run: every claim goes past a full window, and
    8 threads claiming at once hold exactly one TI of each run, the first in line."""
    dag = DagFactory(max_active_tasks=1)
    firsts = []
    for r in range(6):
        run = DagRunFactory(dag=dag)
        firsts.append(queued(run, weight=100 - r, n=claims_sql.candidate_window(2) + 3)[0].id)
    got = _claim_at_once(threads=8, tries=2, limit=2)
    assert sorted(got) == sorted(firsts)


# --- /api/v2/pools ----------------------------------------------------------------------------


@pytest.fixture
def api():
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"})


def _send(api, method, path, body=None):
    return getattr(api, method)(
        f"/api/v2{path}", data=json.dumps(body), content_type="application/json"
    )


def test_pool_crud_with_airflows_shapes(api):
    made = _send(api, "post", "/pools", {"name": "gpu", "slots": 3, "description": "cards"})
    assert made.status_code == 201, made.content
    assert made.json() == {
        "name": "gpu",
        "slots": 3,
        "description": "cards",
        "include_deferred": False,
        "occupied_slots": 0,
        "running_slots": 0,
        "queued_slots": 0,
        "scheduled_slots": 0,
        "open_slots": 3,
        "deferred_slots": 0,
        "team_name": None,
    }
    assert _send(api, "post", "/pools", {"name": "gpu", "slots": 1}).status_code == 409
    run = DagRunFactory()
    tis = queued(run, pool="gpu", n=3)
    TaskInstance.objects.filter(id=tis[0].id).update(state=TIState.RUNNING)
    claims.claim_workloads(hostname="w", limit=1)
    got = api.get("/api/v2/pools/gpu").json()
    assert (got["running_slots"], got["queued_slots"], got["scheduled_slots"]) == (1, 1, 1)
    assert (got["occupied_slots"], got["open_slots"]) == (2, 1)

    listed = api.get("/api/v2/pools", {"order_by": "name"}).json()
    assert [p["name"] for p in listed["pools"]] == ["default_pool", "gpu"]
    assert listed["total_entries"] == 2
    assert api.get("/api/v2/pools", {"pool_name_pattern": "gp"}).json()["total_entries"] == 1

    patched = _send(api, "patch", "/pools/gpu?update_mask=slots", {"slots": -1, "description": "x"})
    assert patched.status_code == 200, patched.content
    assert (patched.json()["slots"], patched.json()["description"]) == (-1, "cards")
    assert patched.json()["open_slots"] == -1  # unlimited, as Airflow answers it
    assert api.delete("/api/v2/pools/gpu").status_code == 204
    assert api.get("/api/v2/pools/gpu").status_code == 404
    assert api.delete("/api/v2/pools/gpu").status_code == 404


def test_default_pool_cannot_be_deleted_and_only_its_slots_change(api):
    before = db_snapshot()
    deleted = api.delete("/api/v2/pools/default_pool")
    assert deleted.status_code == 400
    assert "Default Pool can't be deleted" in deleted.json()["detail"]["message"]
    renamed = _send(api, "patch", "/pools/default_pool", {"description": "mine"})
    assert renamed.status_code == 400
    assert db_snapshot() == before
    ok = _send(api, "patch", "/pools/default_pool?update_mask=slots", {"slots": 8})
    assert ok.status_code == 200 and ok.json()["slots"] == 8


def test_a_masked_field_the_body_left_out_keeps_its_value(api):
    """Airflow 3.3.2's `apply_patch_with_update_mask`: the fields written are those the body
    carried that the mask names; a name the body cannot change is ignored, as Airflow does."""
    Pool.objects.create(name="gpu", slots=3, description="cards", include_deferred=True)
    patched = _send(
        api, "patch", "/pools/gpu?update_mask=description&update_mask=slots", {"slots": 5}
    )
    assert patched.status_code == 200, patched.content
    assert (patched.json()["slots"], patched.json()["description"]) == (5, "cards")
    ignored = _send(api, "patch", "/pools/gpu?update_mask=bogus", {"slots": 9})
    assert ignored.status_code == 200, ignored.content
    pool = Pool.objects.get(name="gpu")
    assert (pool.slots, pool.description, pool.include_deferred) == (5, "cards", True)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", "/pools", {"name": "p", "slots": -2}, 422),
        ("post", "/pools", {"name": "p", "slots": 2**31}, 422),
        ("post", "/pools", {"name": "", "slots": 1}, 422),
        ("post", "/pools", {"name": "p"}, 422),
        ("post", "/pools", {"name": "p", "slots": 1, "team_name": "t"}, 422),
        ("post", "/pools", {"name": "p", "slots": 1, "unknown": 1}, 422),
        ("patch", "/pools/default_pool?update_mask=slots", {"slots": "many"}, 422),
        ("patch", "/pools/other", {"name": "another"}, 400),
        ("patch", "/pools/missing", {"slots": 1}, 404),
    ],
)
def test_bad_pool_input_is_refused_and_writes_nothing(api, method, path, body, status):
    Pool.objects.create(name="other", slots=1)
    before = db_snapshot()
    response = _send(api, method, path, body)
    assert response.status_code == status, response.content
    assert db_snapshot() == before


# --- the admin ----------------------------------------------------------------------------------


def test_the_admin_creates_edits_and_deletes_pools_through_the_domain(admin_client):
    added = admin_client.post(
        "/admin/assets_app/pool/add/",
        {"name": "gpu", "slots": "2", "description": "cards", "include_deferred": ""},
    )
    assert added.status_code == 302, added.content
    gpu = Pool.objects.get(name="gpu")
    assert gpu.slots == 2
    page = admin_client.get("/admin/assets_app/pool/")
    assert b"unlimited" not in page.content and b"gpu" in page.content
    changed = admin_client.post(
        f"/admin/assets_app/pool/{gpu.pk}/change/", {"slots": "-1", "description": "many"}
    )
    assert changed.status_code == 302, changed.content
    gpu.refresh_from_db()
    assert (gpu.slots, gpu.description) == (-1, "many")
    assert b"unlimited" in admin_client.get("/admin/assets_app/pool/").content
    default = Pool.objects.get(name=DEFAULT_POOL_NAME)
    refused = admin_client.get(f"/admin/assets_app/pool/{default.pk}/delete/")
    assert refused.status_code == 403
    admin_client.post(f"/admin/assets_app/pool/{gpu.pk}/delete/", {"post": "yes"})
    assert not Pool.objects.filter(name="gpu").exists()
    assert AuditEntry.objects.filter(action__startswith="pool.").count() == 3


def test_the_pools_command_sets_lists_and_deletes():
    out = StringIO()
    call_command("pools", "set", "gpu", "2", "cards", stdout=out)
    call_command("pools", "set", "default_pool", "64", stdout=out)
    assert Pool.objects.get(name="gpu").slots == 2
    assert Pool.objects.get(name=DEFAULT_POOL_NAME).slots == 64
    out = StringIO()
    call_command("pools", "list", stdout=out)
    assert "gpu\tslots 2\trunning 0\tclaimed 0\topen 2\tcards" in out.getvalue()
    with pytest.raises(CommandError, match="Default Pool can't be deleted"):
        call_command("pools", "delete", "default_pool")
    call_command("pools", "delete", "gpu", stdout=out)
    assert not Pool.objects.filter(name="gpu").exists()


def test_a_pool_counts_the_slots_of_every_queue():
    """Airflow's pools are counted across queues: a TI claimed from another queue holds its
    pool's slot too."""
    Pool.objects.create(name="p", slots=1)
    run = DagRunFactory()
    task = TaskFactory(dag=run.dag, pool="p", queue="gpu")
    TaskInstanceFactory(dag_run=run, task_id=task.task_id)
    (plain,) = queued(run, pool="p")
    assert len(claims.claim_workloads(hostname="w", limit=5, queues=["gpu"])) == 1
    assert claimed_ids() == []
    TaskInstance.objects.exclude(id=plain.id).update(state=TIState.SUCCESS)
    assert claimed_ids() == [plain.id]


# --- max_active_tasks, max_active_tis_per_dag, max_active_tis_per_dagrun ---------------------


def test_a_run_has_at_most_max_active_tasks_claimed_or_running():
    """Airflow 3 counts a Dag's `max_active_tasks` per run: queued (claimed) and running."""
    dag = DagFactory(max_active_tasks=2)
    first, second = DagRunFactory(dag=dag), DagRunFactory(dag=dag)
    tis = queued(first, n=4)
    TaskInstance.objects.filter(id=tis[0].id).update(state=TIState.RUNNING)
    others = queued(second, n=3)
    assert set(claimed_ids()) == {tis[1].id, others[0].id, others[1].id}
    assert claimed_ids() == []


def test_a_task_has_at_most_max_active_tis_per_dag_over_runs_and_per_dagrun_in_one():
    dag = DagFactory(max_active_tasks=100)
    runs = [DagRunFactory(dag=dag) for _ in range(3)]
    per_dag = TaskFactory(dag=dag, task_id="per_dag", max_active_tis_per_dag=2)
    per_run = TaskFactory(dag=dag, task_id="per_run", max_active_tis_per_dagrun=1)
    for run in runs:
        for task in (per_dag, per_run):
            for i in range(2):
                TaskInstanceFactory(dag_run=run, task_id=task.task_id, map_index=i)
    got = TaskInstance.objects.filter(id__in=claimed_ids())
    assert got.filter(task_id="per_dag").count() == 2
    assert sorted(got.filter(task_id="per_run").values_list("run_id", flat=True)) == sorted(
        run.run_id for run in runs
    )
    assert claimed_ids() == []


def test_a_ti_held_back_by_its_run_does_not_hold_back_another_runs_ti_in_its_pool():
    """Airflow passes over a TI its run's limit keeps back (`starved_dags`); the pool's one
    open slot goes to the next TI in line, now and not after the full run frees a slot."""
    Pool.objects.create(name="p", slots=2)
    full = DagRunFactory(dag=DagFactory(max_active_tasks=1))
    (running, heavy) = queued(full, pool="p", weight=10, n=2)
    TaskInstance.objects.filter(id=running.id).update(state=TIState.RUNNING)
    (light,) = queued(DagRunFactory(), pool="p", weight=1)
    assert claimed_ids() == [light.id]
    assert heavy.id not in claimed_ids()


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_of_two_queues_never_exceed_a_runs_max_active_tasks():
    """One run's TIs in two queues and two pools, claimers of each queue at once: both lock
    the pools of the whole Dag's claimable TIs, so together they hold exactly
    max_active_tasks."""
    Pool.objects.create(name="gpus", slots=100)
    run = DagRunFactory(dag=DagFactory(max_active_tasks=3))
    gpu = TaskFactory(dag=run.dag, task_id="train", queue="gpu", pool="gpus")
    for i in range(10):
        TaskInstanceFactory(dag_run=run, task_id=gpu.task_id, map_index=i)
    queued(run, n=10)
    barrier = threading.Barrier(8)
    got: list = []

    def claimer(queue: str) -> None:
        try:
            barrier.wait()
            for _ in range(3):
                got.extend(
                    w.ti.id for w in claims.claim_workloads(hostname=queue, limit=2, queues=[queue])
                )
        finally:
            connection.close()

    threads = [
        threading.Thread(target=claimer, args=("gpu" if i % 2 else "default",)) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == len(set(got)) == 3
