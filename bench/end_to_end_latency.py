"""End-to-end latency: a worker's success response -> the downstream DagRun committed.

Real processes: gunicorn (2 sync workers) and a django-q2 `qcluster` (Q_CLUSTER_WORKERS=2, ORM
broker, poll Q_CLUSTER_POLL: 0.02 s by default), `queue` mode. PRODUCERS producer assets each have
one downstream Dag scheduled on them. The load generator sends `success` for running producer TIs
at a steady RATE per second (60 s full, 10 s quick), round-robin over the assets, and notes when
each 204 arrived. A bench-only PostgreSQL trigger on the consumed-event link table sends NOTIFY
with the event id; PostgreSQL delivers a NOTIFY when the inserting transaction commits, so the
listener's receipt time is the moment the downstream run (and its links) became visible.
latency = NOTIFY receipt - success response receipt (same clock, same process).

The sweep schedules are not installed in the bench database (`setup_schedules` is not run), so
only the on-commit nudge path can produce runs: the 1-minute sweep plays no part by construction.

Targets (issue 6): p50 at most 100 ms, p99 at most 1 s, at 50 successes/s for 60 s.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import _harness as h

NAME = "end_to_end_latency"
PRODUCERS = 50
RATE = 50.0
TARGET_P50_MS = 100.0
TARGET_P99_MS = 1000.0

NOTIFY_SQL = """
CREATE OR REPLACE FUNCTION bench_notify_consumed() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('bench_consumed', NEW.asset_event_id::text);
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_notify_consumed AFTER INSERT ON assets_app_dagrunassetevent
  FOR EACH ROW EXECUTE FUNCTION bench_notify_consumed();
"""


class Listener(threading.Thread):
    """LISTEN bench_consumed on its own connection; records (monotonic time, event id)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("LISTEN bench_consumed")
        self.received: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for notify in self.conn.notifies(timeout=0.2):
                self.received.setdefault(int(notify.payload), time.monotonic())


def main() -> None:
    args = h.parse_args(__doc__)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    import requests
    from django.db import connection
    from django_q.models import Schedule

    from assets_app.api.auth import issue_token
    from assets_app.models import AssetEvent, TIState

    seconds = 10 if args.quick else 60
    total = int(RATE * seconds)
    assets = fx.make_assets(PRODUCERS, prefix="e2e")
    for asset in assets:
        fx.make_scheduled_dags([asset], count=1, prefix=f"down_{asset.id}", max_active_runs=100000)
    producer = fx.make_producer(dag_id="producer", task_id="t", outlets=assets)
    tis = fx.make_tis_in_runs(dag=producer.dag, count=total, state=TIState.RUNNING)
    tokens = [issue_token(ti.id, try_number=ti.try_number) for ti in tis]
    outlets = fx.outlets_of(assets)
    with connection.cursor() as cursor:
        cursor.execute(NOTIFY_SQL)
    sweeps = Schedule.objects.count()
    if sweeps:
        raise SystemExit("the bench database must not have sweep schedules")
    connection.close()

    listener = Listener(url)
    listener.start()
    qcluster = h.start_qcluster(url, log=h.log_path(NAME, "qcluster"))
    try:
        server, base = h.start_gunicorn(url, workers=2, log=h.log_path(NAME, "gunicorn"))
    except BaseException:
        qcluster.stop()
        raise
    responses: dict[str, float] = {}
    errors: list[str] = []
    local = threading.local()

    def send(i: int, at: float) -> None:
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ti = tis[i]
        body = {
            "state": "success",
            "end_date": datetime.now(UTC).isoformat(),
            "task_outlets": [outlets[i % PRODUCERS]],
            "outlet_events": [],
        }
        http = getattr(local, "http", None) or requests.Session()
        local.http = http
        try:
            response = http.patch(
                f"{base}/execution/task-instances/{ti.id}/state",
                json=body,
                headers={"Authorization": f"Bearer {tokens[i]}"},
                timeout=30,
            )
            if response.status_code == 204:
                responses[str(ti.id)] = time.monotonic()
            else:
                errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
        except requests.RequestException as exc:
            errors.append(repr(exc))

    try:
        time.sleep(2.0)  # let the cluster's workers come up before the clock starts
        started = time.monotonic() + 0.5
        with ThreadPoolExecutor(max_workers=16) as pool:
            for i in range(total):
                pool.submit(send, i, started + i / RATE)
        sent_seconds = time.monotonic() - started
        deadline = time.monotonic() + 60
        while len(listener.received) < len(responses) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.stop()
        qcluster.stop()
        listener.stop.set()
        listener.join(2)
        listener.conn.close()

    source = dict(
        AssetEvent.objects.filter(id__in=list(listener.received)).values_list("id", "source_ti_id")
    )
    latencies = [
        (listener.received[event_id] - responses[str(ti_id)]) * 1000.0
        for event_id, ti_id in source.items()
        if str(ti_id) in responses
    ]
    missing = len(responses) - len(latencies)
    s = h.stats(latencies)
    p50_ok = s["median"] <= TARGET_P50_MS
    p99_ok = s["p99"] <= TARGET_P99_MS and not missing and not errors
    h.print_table(
        f"end-to-end latency, success response -> downstream DagRun committed "
        f"({len(responses)} successes paced at {RATE:g}/s, sent in {sent_seconds:.0f} s = "
        f"{len(responses) / sent_seconds:.0f}/s achieved; qcluster 2 workers, gunicorn 2 workers)",
        ["metric", "ms", "target"],
        [
            ["p50", s["median"], f"<= {TARGET_P50_MS:g}"],
            ["p90", s["p90"], ""],
            ["p99", s["p99"], f"<= {TARGET_P99_MS:g}"],
            ["min", s["min"], ""],
            ["max", s["max"], ""],
            ["never consumed", missing, "0"],
            ["request errors", len(errors), "0"],
        ],
    )
    print(
        f"targets: p50 <= {TARGET_P50_MS:g} ms -> {'MET' if p50_ok else 'MISSED'}; "
        f"p99 <= {TARGET_P99_MS:g} ms, all consumed, no errors -> "
        f"{'MET' if p99_ok else 'MISSED'}\n"
    )
    h.write_results(
        NAME,
        {
            "rate_per_s": RATE,
            "seconds": seconds,
            "successes": len(responses),
            "sent_seconds": sent_seconds,
            "achieved_rate_per_s": len(responses) / sent_seconds,
            "producers": PRODUCERS,
            "sweep_schedules_installed": sweeps,
            "latency_ms": s,
            "never_consumed": missing,
            "errors": errors[:20],
            "error_count": len(errors),
            "target": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS, "met": p50_ok and p99_ok},
        },
        args,
    )
    h.plot_hist(
        NAME,
        args,
        title="End-to-end latency: success response -> downstream DagRun committed",
        xlabel="ms",
        values=latencies,
        markers={"p50": s["median"], "p99": s["p99"]},
    )
    if not args.keep_db:
        connection.close()
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
