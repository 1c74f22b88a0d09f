"""Burst: CONCURRENCY concurrent successes with OUTLETS outlets each against the service.

The service as the README starts it (`bin/serve`, issue 41: its Procfile's gunicorn with
WEB_WORKERS=WORKERS sync workers, the django-q2 cluster (2 workers) draining, the timers and the
watchers, every sweep installed), `queue` mode. All requests are released at once from one
client thread (a non-blocking socket per request, `fire`). Measured: errors (non-204 answers and
connection failures), request latency, peak memory of the gunicorn master + workers and of the
qcluster's processes (`MemorySampler`), and the time from the release until all CONCURRENCY x
OUTLETS events are registered (the outbox polled every 100 ms, then the events counted). Each
asset is scheduled on by FANOUT Dags, as in the lock benchmark.

Targets (issue 14, 500 calls): zero errors, p99 at most 3 s, web CPU at most 5 ms per success
(gunicorn's CPU until the last answer / calls), every event registered within 30 s of the last
answer, peak RSS under 512 MB for the web workers together and under 300 MB for the cluster.
At 2,000 calls (`--calls 2000`): p99 at most 12 s, nothing lost; the rest scales linearly.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from datetime import UTC, datetime

import _harness as h

NAME = "burst"
OUTLETS = 300
FANOUT = 4
WORKERS = 4
TARGET_P99_MS = {500: 3000.0, 2000: 12000.0}
TARGET_RSS_MB = 512.0
TARGET_QCLUSTER_RSS_MB = 300.0
TARGET_WEB_CPU_MS = 5.0
# Seconds from the last answer until every event is registered (500 calls; linear above).
TARGET_REGISTERED_AFTER_S = 30.0


class MemorySampler(threading.Thread):
    """Peak memory of process trees: RSS summed over the tree (every 50 ms) and PSS summed over
    the tree (every 250 ms, from /proc/PID/smaps_rollup).

    The two differ for a tree of forked processes: each process's RSS counts the pages it shares
    with its parent (Django, the libraries) again, PSS divides a shared page among the processes
    that map it. An idle 6-process django-q2 cluster has an RSS sum of ~350 MB and a PSS sum of
    ~90 MB. The tree's process list is refreshed every second (psutil's children() reads every
    process on the machine).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self.peak_pss = dict.fromkeys(pids, 0)
        # Peak PSS of each process of each tree (pid -> bytes): which process grew.
        self.peak_pss_by_pid: dict[str, dict[int, int]] = {name: {} for name in pids}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        trees: dict[str, list] = {}
        refreshed = 0.0
        tick = 0
        while not self.stop.is_set():
            if time.monotonic() - refreshed >= 1.0:
                for name, pid in self.pids.items():
                    try:
                        root = psutil.Process(pid)
                        trees[name] = [root, *root.children(recursive=True)]
                    except psutil.Error:
                        trees[name] = []
                refreshed = time.monotonic()
            for name, procs in trees.items():
                rss = pss = 0
                for proc in procs:
                    try:
                        if tick % 5 == 0:
                            info = proc.memory_full_info()
                            pss += info.pss
                            by_pid = self.peak_pss_by_pid[name]
                            by_pid[proc.pid] = max(by_pid.get(proc.pid, 0), info.pss)
                        else:
                            info = proc.memory_info()
                        rss += info.rss
                    except psutil.Error:
                        pass
                self.peak[name] = max(self.peak[name], rss)
                if tick % 5 == 0:
                    self.peak_pss[name] = max(self.peak_pss[name], pss)
            tick += 1
            time.sleep(0.05)


def request_bytes(port: int, ti_id, token: str, body: bytes) -> bytes:
    """One whole HTTP/1.1 request, encoded before the release."""
    head = (
        f"PATCH /execution/task-instances/{ti_id}/state HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def fire(port: int, wire: list[bytes], on_answer, *, timeout: float = 600.0) -> None:
    """Release every request at once from one thread: a non-blocking socket per request, all
    connected and written from one selector loop, each answer read to the end (the server closes
    it: `Connection: close`). Calls `on_answer(ms since the release, error or None)` per request.

    One thread, not a thread per request: with 500 threads, a thread that had connected could
    wait for the GIL before it wrote its request while the gunicorn worker that accepted it sat
    waiting for the body, so the client's scheduling showed up as server latency."""
    import selectors
    import socket

    selector = selectors.DefaultSelector()
    released = time.monotonic()
    for request in wire:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE, [memoryview(request), bytearray()])
    pending = len(wire)

    def done(sock: socket.socket, error: str | None) -> None:
        nonlocal pending
        selector.unregister(sock)
        sock.close()
        pending -= 1
        on_answer((time.monotonic() - released) * 1000.0, error)

    while pending and time.monotonic() - released < timeout:
        for key, mask in selector.select(timeout=1.0):
            sock, (out, answer) = key.fileobj, key.data
            try:
                if mask & selectors.EVENT_WRITE:
                    sent = sock.send(out)
                    key.data[0] = out = out[sent:]
                    if not out:
                        selector.modify(sock, selectors.EVENT_READ, key.data)
                    continue
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                done(sock, repr(exc))
                continue
            if chunk:
                answer += chunk
                continue
            status = bytes(answer.split(b"\r\n", 1)[0])
            done(sock, None if status.startswith(b"HTTP/1.1 204") else status.decode("replace"))
    for key in list(selector.get_map().values()):
        done(key.fileobj, f"no answer in {timeout:g} s")


def cpu_seconds(gunicorn_pid: int, qcluster_pid: int, conn) -> dict[str, float]:
    """Cumulative user+system CPU of each side of the benchmark, by process tree."""
    import os

    import psutil

    def tree(pid: int) -> list:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def total(procs) -> float:
        seconds = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
                seconds += times.user + times.system
            except psutil.Error:
                pass
        return seconds

    backends = [
        psutil.Process(pid)
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        if psutil.pid_exists(pid)
    ]
    return {
        "gunicorn (all workers)": total(tree(gunicorn_pid)),
        "qcluster (drain)": total(tree(qcluster_pid)),
        "postgres backends of this database": total(backends),
        "load generator (this process)": total([psutil.Process(os.getpid())]),
    }


def one_round(url: str, concurrency: int) -> dict:
    """One burst on a freshly created database `url`: fixtures, servers, the release, the
    watch until everything is registered. Returns the round's measurements."""
    import _fixtures as fx
    import psycopg
    import requests
    from django.db import connection

    from assets_app.api.auth import issue_token
    from assets_app.models import TIState

    expected = concurrency * OUTLETS
    watch_seconds = 180 if concurrency <= 500 else 900
    assets = fx.make_assets(OUTLETS, prefix="burst")
    fx.make_scheduled_dags(assets, count=FANOUT, prefix="consumer")
    producer = fx.make_producer(dag_id="producer", task_id="t", outlets=assets)
    tis = fx.make_tis_in_runs(dag=producer.dag, count=concurrency, state=TIState.RUNNING)
    tokens = [issue_token(ti.id, try_number=ti.try_number) for ti in tis]
    outlets = fx.outlets_of(assets)
    connection.close()

    from django.conf import settings

    service = h.start_service(
        url,
        log=h.log_path(NAME, "serve"),
        WEB_WORKERS=str(WORKERS),
        SECRET_KEY=settings.SECRET_KEY,  # the TI tokens made here
    )
    base = service.url
    pids = h.service_pids(service)
    server_pid, qcluster_pid = pids["web"], pids["cluster"]
    # Warm each worker (imports, DB connection) so the burst measures serving, not start-up.
    for _ in range(WORKERS * 3):
        requests.get(f"{base}/execution/docs", timeout=30)
    port = int(base.rsplit(":", 1)[1])
    # The load generator shares the 2 cores with the server: every request is encoded whole
    # before the release and sent on a plain socket (an HTTP library spent ~13 ms of CPU per
    # request here, more than the server), and nothing is polled that scans a growing table.
    body = json.dumps(
        {
            "state": "success",
            "end_date": datetime.now(UTC).isoformat(),
            "task_outlets": outlets,
            "outlet_events": [],
        }
    ).encode()
    wire = [request_bytes(port, ti.id, token, body) for ti, token in zip(tis, tokens, strict=True)]
    sampler = MemorySampler({"gunicorn": server_pid, "qcluster": qcluster_pid})
    sampler.start()
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def answered_one(ms: float, error: str | None) -> None:
        with lock:
            latencies.append(ms)
            if error:
                errors.append(error)

    client = threading.Thread(target=fire, args=(port, wire, answered_one), daemon=True)
    registered_at = None
    cpu = {}
    registered = 0
    try:
        with psycopg.connect(url, autocommit=True) as watch:
            cpu["start"] = cpu_seconds(server_pid, qcluster_pid, watch)
            client.start()
            released = time.monotonic()
            while time.monotonic() - released < watch_seconds:
                answered = len(latencies) == concurrency
                if "responses" not in cpu and answered:
                    cpu["responses"] = cpu_seconds(server_pid, qcluster_pid, watch)
                # Every answered success left one outbox row, deleted in the transaction that
                # registers its events: once all are answered and none is left, count the events.
                waiting = watch.execute(
                    "SELECT count(*) FROM assets_app_asseteventqueue WHERE parked_at IS NULL"
                ).fetchone()[0]
                if answered and waiting == 0:
                    registered = watch.execute(
                        "SELECT count(*) FROM assets_app_assetevent"
                    ).fetchone()[0]
                    if registered >= expected:
                        registered_at = time.monotonic() - released
                        cpu["registered"] = cpu_seconds(server_pid, qcluster_pid, watch)
                        break
                time.sleep(0.1)
            if registered_at is None:
                query = "SELECT count(*) FROM assets_app_assetevent"
                registered = watch.execute(query).fetchone()[0]
        client.join(120)
        responses_done = max(latencies) / 1000.0 if latencies else None
    finally:
        sampler.stop.set()
        sampler.join(1)
        service.stop()

    cpu_during = {}
    if "responses" in cpu:
        cpu_during = {name: cpu["responses"][name] - cpu["start"][name] for name in cpu["start"]}
    rss_mb = sampler.peak["gunicorn"] / 2**20
    q_rss_mb = sampler.peak["qcluster"] / 2**20
    pss_mb = sampler.peak_pss["gunicorn"] / 2**20
    q_pss_mb = sampler.peak_pss["qcluster"] / 2**20
    web_cpu_ms = cpu_during["gunicorn (all workers)"] / concurrency * 1000 if cpu_during else None
    after_last = (
        registered_at - responses_done
        if registered_at is not None and responses_done is not None
        else None
    )
    return {
        "latencies": latencies,
        "errors": errors,
        "rss_mb": rss_mb,
        "q_rss_mb": q_rss_mb,
        "pss_mb": pss_mb,
        "q_pss_mb": q_pss_mb,
        "q_pss_by_process": sorted(
            (round(v / 2**20, 1) for v in sampler.peak_pss_by_pid["qcluster"].values()),
            reverse=True,
        ),
        "web_cpu_ms": web_cpu_ms,
        "cpu_during": cpu_during,
        "responses_done": responses_done,
        "registered_at": registered_at,
        "registered": registered,
        "after_last": after_last,
        "expected": expected,
        "watch_seconds": watch_seconds,
    }


def _median(values: list) -> float | None:
    """The median of the rounds' values; None when a round has none (nothing registered)."""
    return None if any(v is None for v in values) else statistics.median(values)


def main() -> None:
    def extra(parser):
        parser.add_argument(
            "--calls",
            type=int,
            default=None,
            help="concurrent successes (default 500, 100 with --quick); results of another "
            "size go to burst_<calls>.json",
        )

    args = h.parse_args(__doc__, extra)
    h.record_machine_start()
    global NAME
    concurrency = args.calls or (100 if args.quick else 500)
    if args.calls and args.calls != 500:
        NAME = f"burst_{args.calls}"
    # Rounds: the figures of one burst move with the machine (web CPU per success 3.2-5.0 ms
    # in six runs of the same code), so the table gives the median of several, each on a
    # fresh database; one round at 2,000 calls (~2 minutes each).
    rounds = args.rounds or (1 if args.quick or concurrency > 500 else 3)
    url = h.fresh_database(NAME)
    h.setup_django(url)
    results = []
    for number in range(rounds):
        if number:
            url = h.fresh_database(NAME)
        results.append(one_round(url, concurrency))
        r = results[-1]
        print(
            f"round {number + 1}/{rounds}: p99 {h.fmt(h.stats(r['latencies']).get('p99'))} ms, "
            f"web CPU {h.fmt(r['web_cpu_ms'])} ms/success, errors {len(r['errors'])}, "
            f"cluster RSS/PSS {r['q_rss_mb']:.0f}/{r['q_pss_mb']:.0f} MB, registered "
            f"{h.fmt(r['after_last'])} s after the last answer",
            flush=True,
        )
    errors = [e for r in results for e in r["errors"]]
    latency_stats = [h.stats(r["latencies"]) for r in results]
    keys = set.intersection(*(set(st) for st in latency_stats))
    s = {key: statistics.median(st[key] for st in latency_stats) for key in keys}
    rss_mb = statistics.median(r["rss_mb"] for r in results)
    q_rss_mb = statistics.median(r["q_rss_mb"] for r in results)
    pss_mb = statistics.median(r["pss_mb"] for r in results)
    q_pss_mb = statistics.median(r["q_pss_mb"] for r in results)
    web_cpu_ms = _median([r["web_cpu_ms"] for r in results])
    responses_done = _median([r["responses_done"] for r in results])
    registered_at = _median([r["registered_at"] for r in results])
    after_last = _median([r["after_last"] for r in results])
    registered = min(r["registered"] for r in results)
    expected, watch_seconds = results[0]["expected"], results[0]["watch_seconds"]
    cpu_during = (
        {
            name: statistics.median(r["cpu_during"][name] for r in results)
            for name in results[0]["cpu_during"]
        }
        if all(r["cpu_during"] for r in results)
        else {}
    )
    target_p99 = TARGET_P99_MS.get(concurrency, 3000.0 * concurrency / 500)
    target_registered = TARGET_REGISTERED_AFTER_S * max(1.0, concurrency / 500)
    checks = {
        "errors": len(errors) == 0,
        "p99": s["p99"] <= target_p99,
        "web_cpu": web_cpu_ms is not None and web_cpu_ms <= TARGET_WEB_CPU_MS,
        "rss": rss_mb < TARGET_RSS_MB,
        "qcluster_rss": q_rss_mb < TARGET_QCLUSTER_RSS_MB,
        "registered": after_last is not None and after_last <= target_registered,
    }
    h.print_table(
        f"burst: {concurrency} concurrent successes x {OUTLETS} outlets (fan-out {FANOUT}); "
        f"bin/serve: gunicorn {WORKERS} sync workers, qcluster 2 workers; median of {rounds} "
        "round(s)",
        ["metric", "value", "target", "verdict"],
        [
            ["errors", len(errors), "0", checks["errors"]],
            ["latency p50 ms", s["median"], "", ""],
            ["latency p99 ms", s["p99"], f"<= {target_p99:g}", checks["p99"]],
            ["web CPU per success ms", web_cpu_ms, f"<= {TARGET_WEB_CPU_MS:g}", checks["web_cpu"]],
            ["latency max ms", s["max"], "", ""],
            ["gunicorn peak RSS MB", rss_mb, f"< {TARGET_RSS_MB:g}", checks["rss"]],
            ["gunicorn peak PSS MB", pss_mb, "", ""],
            [
                "qcluster peak RSS MB",
                q_rss_mb,
                f"< {TARGET_QCLUSTER_RSS_MB:g}",
                checks["qcluster_rss"],
            ],
            ["qcluster peak PSS MB", q_pss_mb, "", ""],
            ["all responses after s", responses_done, "", ""],
            [
                f"all {expected:,} events registered after s",
                registered_at
                if registered_at is not None
                else f"not in {watch_seconds} s ({registered:,})",
                "",
                "",
            ],
            [
                "  of it after the last answer s",
                after_last,
                f"<= {target_registered:g}",
                checks["registered"],
            ],
        ],
    )
    if cpu_during:
        h.print_table(
            f"CPU seconds used until the last response ({responses_done:.1f} s wall = "
            f"{2 * responses_done:.1f} CPU-s on 2 cores)",
            ["component", "CPU s", "per request ms"],
            [[name, value, value / concurrency * 1000] for name, value in cpu_during.items()],
        )
    h.write_results(
        NAME,
        {
            "concurrency": concurrency,
            "outlets": OUTLETS,
            "fanout": FANOUT,
            "gunicorn_workers": WORKERS,
            "latency_ms": s,
            "error_count": len(errors),
            "errors": errors[:20],
            "gunicorn_peak_rss_mb": rss_mb,
            "qcluster_peak_rss_mb": q_rss_mb,
            "gunicorn_peak_pss_mb": pss_mb,
            "qcluster_peak_pss_mb": q_pss_mb,
            "qcluster_peak_pss_mb_by_process": results[len(results) // 2]["q_pss_by_process"],
            "rounds": [
                {
                    "latency_ms": h.stats(r["latencies"]),
                    "error_count": len(r["errors"]),
                    "web_cpu_ms_per_success": r["web_cpu_ms"],
                    "gunicorn_peak_rss_mb": r["rss_mb"],
                    "qcluster_peak_rss_mb": r["q_rss_mb"],
                    "qcluster_peak_pss_mb": r["q_pss_mb"],
                    "qcluster_peak_pss_mb_by_process": r["q_pss_by_process"],
                    "all_responses_s": r["responses_done"],
                    "all_registered_s": r["registered_at"],
                    "registered_after_last_answer_s": r["after_last"],
                    "events_registered": r["registered"],
                    "cpu_seconds_until_last_response": r["cpu_during"],
                }
                for r in results
            ],
            "all_responses_s": responses_done,
            "events_expected": expected,
            "events_registered": registered,
            "all_registered_s": registered_at,
            "cpu_seconds_until_last_response": cpu_during,
            "target": {
                "errors": 0,
                "p99_ms": target_p99,
                "web_cpu_ms_per_success": TARGET_WEB_CPU_MS,
                "rss_mb": TARGET_RSS_MB,
                "qcluster_rss_mb": TARGET_QCLUSTER_RSS_MB,
                "registered_after_last_answer_s": target_registered,
                "met": checks,
            },
        },
        args,
    )
    h.plot_hist(
        NAME,
        args,
        title=f"Burst: {concurrency} concurrent successes x {OUTLETS} outlets, request latency",
        xlabel="ms",
        values=[ms for r in results for ms in r["latencies"]],
        markers={"p50": s["median"], "p99": s["p99"]},
    )
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
