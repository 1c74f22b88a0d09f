"""Crash: SIGKILL the web server (gunicorn, master and workers) in the middle of requests.

8 worker threads keep reporting successes (30 outlets each) over HTTP. A killer waits a random
moment, then for a request in flight, and SIGKILLs the whole gunicorn process group; it restarts
it on the same port at once. A worker whose request died retries the identical request until it
is answered, as a real worker does. Some dropped requests had committed before the kill (the retry
is a replay: 200, nothing written), others had not (the retry applies it: 204). Afterwards, with
the outbox drained: every answer was 200 or 204, every TI is in success with try 1, and its
outlets became exactly one set of events.
"""

import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from assets_app.models import AssetEvent, AssetEventQueue, TaskInstance
from assets_app.outbox import drain

from .conftest import figure, make_running_tis, run_in_threads
from .workers import patch_state_until_answered, success_body

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ASSETS = [f"crash-web-{i}" for i in range(40)]
OUTLETS_PER_TI = 30
TI_POOL = 1500
KILLS = 10
WORKERS = 8


@pytest.mark.parametrize("mode", ["queue", "inline"])
def test_sigkill_gunicorn_mid_request_retry_changes_state_once(servers, mode):
    """Both registration modes (DESIGN 5): in `inline` the events commit with the success
    itself, so a kill before that commit must leave neither."""
    tis = make_running_tis("crash_web_producer", TI_POOL)
    rng = random.Random(5)
    outlets = {ti.id: rng.sample(ASSETS, OUTLETS_PER_TI) for ti in tis}
    web = servers("gunicorn", workers=1, env={"ASSET_REGISTRATION_MODE": mode})
    pending = list(tis)
    lock = threading.Lock()
    answers: dict = {}
    stats: Counter = Counter()
    in_flight = [0]
    stop = threading.Event()

    def worker(n: int) -> None:
        local = random.Random(n)
        while not stop.is_set():
            with lock:
                if not pending:
                    return
                ti = pending.pop()
                in_flight[0] += 1
            body = success_body(outlets[ti.id], end_date=datetime.now(UTC))
            try:
                response, failures = patch_state_until_answered(
                    web.url, ti.id, body, deadline=time.monotonic() + 60
                )
            finally:
                with lock:
                    in_flight[0] -= 1
            with lock:
                answers[ti.id] = response.status_code
                stats["requests_dropped"] += failures
                if failures:
                    stats[f"retried_then_{response.status_code}"] += 1
            time.sleep(local.uniform(0.0, 0.05))

    def killer() -> None:
        local = random.Random(42)
        try:
            for _ in range(KILLS):
                time.sleep(local.uniform(0.05, 0.4))
                deadline = time.monotonic() + 5
                while in_flight[0] == 0 and time.monotonic() < deadline:
                    time.sleep(0.001)
                time.sleep(local.uniform(0, 0.01))
                web.kill()
                stats["kills"] += 1
                web.start()
        finally:
            stop.set()

    started = time.monotonic()
    run_in_threads([killer] + [lambda n=n: worker(n) for n in range(WORKERS)], timeout=200)
    elapsed = time.monotonic() - started
    web.stop()
    while drain.drain().claimed:
        pass

    answered = set(answers)
    succeeded = [ti for ti in tis if ti.id in answered]
    figure(
        f"crash web ({mode} mode): {stats['kills']} SIGKILLs, {len(answered)} successes, "
        f"{stats['requests_dropped']} connection failures, "
        f"retries answered 200 (had committed) {stats['retried_then_200']}, "
        f"204 (had not) {stats['retried_then_204']}, {elapsed:.1f} s"
    )
    assert stats["kills"] == KILLS
    assert set(answers.values()) <= {200, 204}
    assert stats["requests_dropped"] >= KILLS // 2
    assert stats["retried_then_200"] + stats["retried_then_204"] >= KILLS // 2
    assert AssetEventQueue.objects.count() == 0
    assert TaskInstance.objects.filter(state="success").count() == len(answered)
    assert set(
        TaskInstance.objects.filter(state="success").values_list("try_number", flat=True)
    ) == {1}
    got: dict = {}
    for ti_id, name in AssetEvent.objects.values_list("source_ti_id", "asset__name"):
        got.setdefault(ti_id, []).append(name)
    assert {k: sorted(v) for k, v in got.items()} == {
        ti.id: sorted(outlets[ti.id]) for ti in succeeded
    }
