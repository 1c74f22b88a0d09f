"""Invariant 11 under crashes: runs follow their Dag while processes die.

1. 16 worker threads finish 50 runs of a diamond-and-fan-in Dag (22 tasks) through the domain
   functions the worker API calls, while a real `run_timers` (its repair timer every 0.3 s) is
   SIGKILLed 5 times. One finish in 20 "dies" between its commit and its downstream
   evaluation, so only the repair can move those runs on. Then, from the times the
   database recorded: no TI was claimed or started before each of its upstream had ended, every
   TI was claimed exactly once in one try, and every run finished (success).
2. The reference worker (`run_worker`, over HTTP against gunicorn) is SIGKILLed mid-task 5
   times with a 1.5 s heartbeat timeout: the sweep retries every TI it was running, and every
   run still finishes.
The TI lock statements themselves are pinned by tests/api/test_execution_lock_hold.py.
"""

import json
import random
import sys
import threading
import time
from collections import Counter

import pytest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import DagRun, DagRunState, TaskInstance, TaskUpstream, TIState
from assets_app.scheduling import runs
from assets_app.task_state import claims, liveness, repair, starting, success
from tests.servers import Server

from .conftest import figure, run_in_threads, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUNS = 50
WORKERS = 16
KILLS = 5
DROP_EVALUATION = 0.05
TIMERS_ENV = {"TASK_REPAIR_INTERVAL_SECONDS": "0.3"}


def diamond_and_fan_in() -> dict:
    """root -> 16 mids -> 4 joins (4 mids each; rules vary) -> final (all_done): 22 tasks."""
    mids = [f"mid_{i:02d}" for i in range(16)]
    rules = ["all_success", "none_failed", "none_failed_min_one_success", "all_done"]
    tasks = [{"task_id": "root"}]
    tasks += [{"task_id": m, "upstream": ["root"]} for m in mids]
    tasks += [
        {"task_id": f"join_{j}", "upstream": mids[4 * j : 4 * j + 4], "trigger_rule": rules[j]}
        for j in range(4)
    ]
    tasks.append(
        {
            "task_id": "final",
            "upstream": [f"join_{j}" for j in range(4)] + ["mid_00"],
            "trigger_rule": "all_done",
        }
    )
    return {"dag_id": "proof_diamond", "tasks": tasks}


def sync(dag: dict) -> None:
    # is_paused false: a sync pauses a new Dag unless it says so (issue 39).
    document = json.dumps({"is_paused": False, **dag})
    definitions.sync_definitions(dags=definitions.parse_text(document, file="proof.json"))


def order_violations(dag_id: str) -> list[str]:
    """TIs claimed or started before one of their upstream TIs had ended (database times)."""
    tis = {
        (t.dag_run_id, t.task_id): t
        for t in TaskInstance.objects.filter(dag_id=dag_id).only(
            "dag_run_id", "task_id", "claimed_at", "start_date", "end_date", "state"
        )
    }
    links = list(
        TaskUpstream.objects.filter(task__dag_id=dag_id).values_list(
            "task__task_id", "upstream__task_id"
        )
    )
    bad = []
    for (run_id, task_id), ti in tis.items():
        for downstream, upstream in links:
            if downstream != task_id:
                continue
            up = tis[(run_id, upstream)]
            if up.end_date is None or ti.claimed_at is None or ti.claimed_at < up.end_date:
                bad.append(
                    f"run {run_id}: {task_id} claimed {ti.claimed_at}, {upstream} ended "
                    f"{up.end_date}"
                )
            elif ti.start_date < up.end_date:
                bad.append(f"run {run_id}: {task_id} started before {upstream} ended")
    return bad


def test_sixteen_workers_follow_the_dag_while_the_timers_are_killed(servers, monkeypatch):
    sync(diamond_and_fan_in())
    real_after = success.after_ti_finished
    dropped = Counter()
    local = threading.local()

    def maybe_dying_after(ti):
        rng = getattr(local, "rng", None) or random.Random(threading.get_ident())
        local.rng = rng
        if rng.random() < DROP_EVALUATION:
            dropped["evaluations"] += 1  # the process died right after the TI's commit
            return
        real_after(ti)

    monkeypatch.setattr(success, "after_ti_finished", maybe_dying_after)
    run_pks = [runs.trigger_dag(dag_id="proof_diamond").pk for _ in range(RUNS)]
    total = TaskInstance.objects.filter(dag_run_id__in=run_pks).count()
    assert total == RUNS * 22
    claim_counts: Counter = Counter()
    claim_counts_lock = threading.Lock()
    done = threading.Event()
    cluster = servers("timers", env=TIMERS_ENV)
    kills = 0

    def all_finished() -> bool:
        return not DagRun.objects.filter(
            pk__in=run_pks, state__in=[DagRunState.QUEUED, DagRunState.RUNNING]
        ).exists()

    def worker(n: int) -> None:
        rng = random.Random(n)
        deadline = time.monotonic() + 150
        while not done.is_set() and time.monotonic() < deadline:
            claimed = claims.claim_workloads(hostname=f"w{n}", limit=1)
            if not claimed:
                time.sleep(0.02)
                continue
            ti = claimed[0].ti
            with claim_counts_lock:
                claim_counts[ti.id] += 1
            starting.start(
                ti_id=ti.id,
                try_number=ti.try_number,
                hostname=f"w{n}",
                unixname="u",
                pid=n + 1,
                start_date=timezone.now(),
            )
            time.sleep(rng.uniform(0, 0.01))
            success.succeed(
                ti_id=ti.id,
                try_number=ti.try_number,
                end_date=timezone.now(),
                task_outlets=[],
                outlet_events=[],
            )

    def watcher() -> None:
        while not done.is_set():
            if all_finished():
                done.set()
            time.sleep(0.3)

    def killer() -> None:
        nonlocal kills
        rng = random.Random(5)
        while kills < KILLS and not done.is_set():
            time.sleep(rng.uniform(0.5, 2.0))
            cluster.kill()
            kills += 1
            cluster.start()

    started = time.monotonic()
    run_in_threads([killer, watcher] + [lambda n=n: worker(n) for n in range(WORKERS)], timeout=200)
    elapsed = time.monotonic() - started
    cluster.kill()

    states = Counter(DagRun.objects.filter(pk__in=run_pks).values_list("state", flat=True))
    tis = TaskInstance.objects.filter(dag_run_id__in=run_pks)
    figure(
        f"dag order: {RUNS} runs x 22 tasks by {WORKERS} workers, {kills} run_timers SIGKILLs, "
        f"{dropped['evaluations']} evaluations lost to a 'crash' and repaired by the timer, "
        f"{elapsed:.1f} s"
    )
    assert kills == KILLS, cluster.log_tail()
    assert dropped["evaluations"] > 0
    assert states == {DagRunState.SUCCESS: RUNS}, cluster.log_tail()
    assert Counter(tis.values_list("state", flat=True)) == {TIState.SUCCESS: total}
    assert set(tis.values_list("try_number", flat=True)) == {1}
    assert len(claim_counts) == total and set(claim_counts.values()) == {1}
    assert order_violations("proof_diamond") == []


def test_reference_worker_killed_mid_task_its_tis_are_retried_and_runs_finish(
    servers, service_env, tmp_path, settings
):
    settings.TASK_HEARTBEAT_TIMEOUT_SECONDS = 1.5
    sync(
        {
            "dag_id": "proof_chain",
            "tasks": [
                {"task_id": "a", "retries": 8, "retry_delay_seconds": 0},
                {"task_id": "b", "upstream": ["a"], "retries": 8, "retry_delay_seconds": 0},
                {"task_id": "c", "upstream": ["b"], "retries": 8, "retry_delay_seconds": 0},
            ],
        }
    )
    web = servers("gunicorn", workers=2, env={"WORKLOAD_CLAIM_TIMEOUT_SECONDS": "2"})
    run_pks = [runs.trigger_dag(dag_id="proof_chain").pk for _ in range(8)]
    worker = Server(
        [
            sys.executable,
            "manage.py",
            "run_worker",
            "--url",
            web.url,
            "--hostname",
            "refw",
            "--concurrency",
            "4",
            "--task-seconds",
            "0.8",
            "--heartbeat-seconds",
            "0.2",
        ],
        service_env,
        tmp_path / "worker.log",
    )
    worker.start()
    killed: set = set()
    repaired: set = set()
    done = threading.Event()

    def sweeper() -> None:
        while not done.is_set():
            result = liveness.fail_dead_task_instances()
            repaired.update(result.retried + result.failed)
            repair.sweep_waiting_runs()
            time.sleep(0.3)

    def killer() -> None:
        try:
            for _ in range(KILLS):
                # Running on the current worker process (its pid), not one killed already.
                running = wait_until(
                    lambda: list(
                        TaskInstance.objects.filter(
                            dag_id="proof_chain",
                            state=TIState.RUNNING,
                            hostname="refw",
                            pid=worker.pid,
                        ).values_list("id", "try_number")
                    ),
                    timeout=60,
                    interval=0.02,
                )
                worker.kill()
                killed.update(running)
                time.sleep(0.2)
                worker.start()
            wait_until(
                lambda: (
                    not DagRun.objects.filter(
                        pk__in=run_pks, state__in=[DagRunState.QUEUED, DagRunState.RUNNING]
                    ).exists()
                ),
                timeout=120,
                interval=0.2,
            )
        finally:
            done.set()

    run_in_threads([killer, sweeper], timeout=200)
    worker.kill()
    final = {t.id: t for t in TaskInstance.objects.filter(dag_id="proof_chain")}
    # A TI the killer saw running either died (the sweep retried or failed it) or its success
    # was already on the wire and landed for that try.
    unexplained = [
        (ti_id, try_number)
        for ti_id, try_number in killed
        if ti_id not in repaired
        and not (final[ti_id].state == TIState.SUCCESS and final[ti_id].try_number == try_number)
    ]
    figure(
        f"dag order: reference worker SIGKILLed {KILLS} times, {len(killed)} TIs running at the "
        f"kills, {len(repaired)} retried/failed by the heartbeat sweep"
    )
    assert unexplained == [], worker.log_tail()
    assert len(repaired) >= KILLS
    assert set(DagRun.objects.filter(pk__in=run_pks).values_list("state", flat=True)) == {
        DagRunState.SUCCESS
    }
    assert order_violations("proof_chain") == []
