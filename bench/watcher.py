"""Queue watchers (issue 28): messages/s and publish -> asset-triggered run committed, beside the
HTTP path (POST /api/v2/assets/events) measured the same way.

Real processes on a fresh database: the service as the README starts it (`bin/serve`: gunicorn
with 2 sync workers for the HTTP path, the django-q2 cluster making the runs, nudged after each
registration's commit, the timers, every sweep installed), its own queue consumer left out
(WATCHERS=0) for the measured `manage.py watch_queues` consumers, one per watcher, on the real
RabbitMQ (localhost:5672). 25 assets, each with one Dag
scheduled on it; a watcher routes routing key `a<k>` to asset k (persistent messages on a
durable queue, published with publisher confirms).

Latency is measured first, on the fresh database (the throughput phases leave 15,000 runs
behind, which slow every later scheduler pass, whichever path made the event).

- throughput: N messages published first, then 1 (and then 2) consumer processes started on
  their own queue; messages/s = registrations over the span from the first to the last
  registration's commit (the consumers' start-up is left out). HTTP: N POSTs from 8 client
  threads; events/s over the same span (first to last event).
- latency: RATE messages (or POSTs) per second for SECONDS s, round-robin over the assets; a
  bench-only PostgreSQL trigger on the consumed-event link table sends NOTIFY with the event id,
  delivered when the run's transaction commits. latency = NOTIFY receipt - the moment just
  before the message was published (the POST was sent), same clock, same process.

bin/serve installs the one-minute sweeps; the nudges make the runs long before a sweep could.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import _harness as h

NAME = "watcher"
ASSETS = 25
RATE = 50.0


def main() -> None:
    def extra(parser):
        parser.add_argument("--messages", type=int, default=None, help="throughput size")
        parser.add_argument("--seconds", type=float, default=None, help="latency phase length")

    args = h.parse_args(__doc__, extra)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    import requests
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Max, Min

    from assets_app.api import public_auth
    from assets_app.models import AssetEvent, QueueWatcher, WatcherMessage, WatcherRoute
    from tests import rabbitmq

    n_messages = args.messages or (500 if args.quick else 5000)
    seconds = args.seconds or (5.0 if args.quick else 30.0)
    assets = fx.make_assets(ASSETS, prefix="watched")
    for asset in assets:
        fx.make_scheduled_dags([asset], count=1, prefix=f"on_{asset.id}", max_active_runs=10**6)
    get_user_model().objects.create_superuser(username="bench", password="bench-pw")
    _, api_key = public_auth.create_api_token(username="bench", name="bench")
    with connection.cursor() as cursor:
        cursor.execute(h.CONSUMED_NOTIFY_SQL)

    def make_watcher(label: str) -> QueueWatcher:
        watcher = QueueWatcher.objects.create(
            name=f"bench-{label}", queue=f"bench-watcher-{label}-{uuid.uuid4().hex[:8]}"
        )
        for k, asset in enumerate(assets):
            WatcherRoute.objects.create(watcher=watcher, routing_key_pattern=f"a{k}").assets.set(
                [asset]
            )
        return watcher

    def consumers(watcher: QueueWatcher, count: int) -> list[h.Server]:
        env = h.server_env(url, ASSET_WATCHER_CHECK_SECONDS="2")
        argv = [h.PYTHON, "manage.py", "watch_queues", "--watcher", watcher.name]
        return [
            h.Server(argv, env, h.log_path(NAME, f"{watcher.name}-{i}")).start()
            for i in range(count)
        ]

    def wait_for(predicate, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out after {timeout} s")
            time.sleep(0.1)

    def span_rate(qs, field: str) -> tuple[float, float]:
        span = qs.aggregate(first=Min(field), last=Max(field))
        seconds = (span["last"] - span["first"]).total_seconds()
        count = qs.count()
        return (count - 1) / seconds if seconds > 0 else float("nan"), seconds

    connection.close()
    listener = h.NotifyListener(url, ["bench_consumed"])
    received = listener.received["bench_consumed"]
    serve = h.start_service(url, log=h.log_path(NAME, "serve"), WATCHERS="0")
    base = serve.url
    http = requests.Session()
    headers = {"Authorization": f"Bearer {api_key}"}
    queues: list[str] = []
    throughput: dict[str, dict[str, float]] = {}
    latency: dict[str, dict[str, float]] = {}
    try:
        # --- latency ----------------------------------------------------------------------
        total = int(RATE * seconds)
        watcher = make_watcher("latency")
        queues.append(watcher.queue)
        procs = consumers(watcher, 1)
        sent: dict[str, float] = {}
        try:
            rabbitmq.publish(watcher.queue, [])  # declares the queue and its exchange
            time.sleep(3.0)  # the consumer's start-up, before the clock starts
            with rabbitmq.channel() as ch:
                ch.confirm_delivery()
                started = time.monotonic()
                for n in range(total):
                    delay = started + n / RATE - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    routing_key, body, props = rabbitmq.message(
                        {"n": n}, routing_key=f"a{n % ASSETS}", message_id=f"l{n}"
                    )
                    sent[f"l{n}"] = time.time()
                    ch.basic_publish(
                        exchange=watcher.queue, routing_key=routing_key, body=body, properties=props
                    )
            events = dict(
                AssetEvent.objects.filter(extra__from_queue=watcher.name).values_list(
                    "id", "extra__message_id"
                )
            )
            wait_for(
                lambda: WatcherMessage.objects.filter(watcher=watcher).count() >= total,
                timeout=300,
            )
            events = dict(
                AssetEvent.objects.filter(extra__from_queue=watcher.name).values_list(
                    "id", "extra__message_id"
                )
            )
            wait_for(lambda: all(str(e) in received for e in events), timeout=300)
        finally:
            for proc in procs:
                proc.stop(timeout=5)
        latency["watcher (1 consumer)"] = h.stats(
            (received[str(e)] - sent[m]) * 1000.0 for e, m in events.items()
        )

        posted: dict[int, float] = {}
        lock = threading.Lock()
        local = threading.local()

        def paced_post(k: int, at: float) -> None:
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            session = getattr(local, "http", None) or requests.Session()
            local.http = session
            before = time.time()
            response = session.post(
                f"{base}/api/v2/assets/events",
                json={"asset_id": assets[k % ASSETS].id, "extra": {"k": k}},
                headers=headers,
                timeout=60,
            )
            if response.status_code == 200:
                with lock:
                    posted[response.json()["id"]] = before

        started = time.monotonic() + 0.5
        with ThreadPoolExecutor(max_workers=16) as pool:
            for k in range(total):
                pool.submit(paced_post, k, started + k / RATE)
        wait_for(lambda: all(str(e) in received for e in posted), timeout=300)
        latency["HTTP POST"] = h.stats((received[str(e)] - at) * 1000.0 for e, at in posted.items())
        # --- throughput -------------------------------------------------------------------
        for count in (1, 2):
            watcher = make_watcher(f"x{count}")
            queues.append(watcher.queue)
            rabbitmq.publish(
                watcher.queue,
                (
                    rabbitmq.message({"n": n}, routing_key=f"a{n % ASSETS}", message_id=f"m{n}")
                    for n in range(n_messages)
                ),
            )
            procs = consumers(watcher, count)
            try:
                rows = WatcherMessage.objects.filter(watcher=watcher)
                wait_for(lambda rows=rows: rows.count() >= n_messages, timeout=600)
            finally:
                for proc in procs:
                    proc.stop(timeout=5)
            rate, span = span_rate(rows, "registered_at")
            throughput[f"watcher, {count} consumer{'s' if count > 1 else ''}"] = {
                "messages": n_messages,
                "per_second": rate,
                "span_seconds": span,
            }

        first_http = AssetEvent.objects.aggregate(m=Max("id"))["m"] or 0

        def post(k: int) -> None:
            response = http.post(
                f"{base}/api/v2/assets/events",
                json={"asset_id": assets[k % ASSETS].id, "extra": {"n": k}},
                headers=headers,
                timeout=60,
            )
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(post, range(n_messages)))
        rate, span = span_rate(AssetEvent.objects.filter(id__gt=first_http), "timestamp")
        throughput["HTTP POST /api/v2/assets/events, 8 clients"] = {
            "messages": n_messages,
            "per_second": rate,
            "span_seconds": span,
        }
        wait_for(lambda: len(received) >= AssetEvent.objects.count(), timeout=600)

    finally:
        serve.stop()
        listener.close()
        for queue in queues:
            rabbitmq.delete(queue)

    h.print_table(
        f"throughput, {n_messages} messages / events over {ASSETS} assets (each with a Dag)",
        ["path", "per s", "span s"],
        [[k, v["per_second"], v["span_seconds"]] for k, v in throughput.items()],
    )
    h.print_table(
        f"latency, publish (POST sent) -> asset-triggered run committed, {RATE:g}/s for "
        f"{seconds:g} s",
        ["path", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [[k, s["n"], s["median"], s["p90"], s["p99"], s["max"]] for k, s in latency.items()],
    )
    h.write_results(
        NAME,
        {
            "assets": ASSETS,
            "rate_per_s": RATE,
            "latency_seconds": seconds,
            "throughput": throughput,
            "latency_ms": latency,
        },
        args,
    )
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
