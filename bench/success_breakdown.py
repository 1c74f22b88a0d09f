"""Where the CPU of one success goes: the request path, component by component.

One process runs the real WSGI application (`project.wsgi.application`, the middleware stack
gunicorn runs, DEBUG off) and calls it directly with WSGI environs of
`PATCH /execution/task-instances/{id}/state` successes of OUTLETS outlets (4 Dags per asset, as
in the burst), one after another: no network, no client, no other load of this benchmark. No
cluster runs, so no drain competes; the nudges queue up in the broker table as in a burst.

Measured, per success (median over the rounds, after warm-up):
- web CPU: the process's CPU time (`time.process_time`) of the whole request;
- PostgreSQL CPU: the user+system CPU of this process's PostgreSQL backend (psutil), per request;
- per component: inclusive CPU and wall time of the functions that make the request (wrapped
  with timers; a component missing from the code under test is shown as `-`), and per SQL
  statement kind the wall time of the statement as the client sees it (PostgreSQL's execution
  plus the loopback round trip).

Components are wrapped by dotted name so the same script measures the code before and after a
change (run it from either checkout). `--profile FILE` also writes a cProfile of the measured
rounds (process CPU timer) for `python -m pstats FILE`.
"""

from __future__ import annotations

import cProfile
import importlib
import io
import json
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime

import _harness as h

NAME = "success_breakdown"
OUTLETS = 300
FANOUT = 4

# (label, dotted path of a function or "module:Class.method"); nested ones are inclusive.
COMPONENTS = [
    (
        "latency middleware (whole stack below it)",
        "assets_app.api.service_middleware:WorkerApiLatencyMiddleware.__call__",
    ),
    ("body guard (413/415/NUL)", "assets_app.api.middleware:ApiRequestGuardMiddleware.__call__"),
    ("  of it: NUL scan", "assets_app.api.middleware:_has_nul"),
    ("ninja operation (auth, parse, validate, view)", "ninja.operation:Operation.run"),
    ("  auth: token check", "assets_app.api.auth:TaskTokenAuth.authenticate"),
    ("    of it: JWT decode", "assets_app.api.auth:decode_token"),
    ("  JSON parse", "assets_app.api.parser:JsonParser.parse_body"),
    ("  parse + validate (ninja _get_values)", "ninja.operation:Operation._get_values"),
    ("    model dumps", "pydantic.main:BaseModel.model_dump"),
    ("    task_state.succeed", "assets_app.task_state.success:succeed"),
    ("      QuerySet.first (TI read + TI lock)", "django.db.models.query:QuerySet.first"),
    ("      TI read (plain SQL)", "assets_app.task_state.success:_read_task_instance"),
    ("      outbox INSERT (enqueue)", "assets_app.outbox.rows:enqueue"),
    ("        payload build", "assets_app.registration.payloads:build"),
    ("      TI lock (SELECT FOR UPDATE)", "assets_app.sql.locks:lock_task_instance"),
    ("      TI UPDATE", "assets_app.task_state.success:_set_success"),
    (
        "      TI lock + UPDATE (one conditional UPDATE)",
        "assets_app.task_state.success:_set_success_if_running",
    ),
    ("      COMMIT", "django.db.backends.base.base:BaseDatabaseWrapper.commit"),
    ("      on-commit: drain nudge", "assets_app.cluster.nudges:nudge_drain"),
    ("      on-commit: counter upsert", "assets_app.operations.metrics:_add"),
    ("      after_ti_finished", "assets_app.task_state.success:after_ti_finished"),
    (
        "histogram: record (schedules the upsert / observes)",
        "assets_app.operations.observability:record_api_latency",
    ),
    ("histogram: upsert after commit", "assets_app.operations.observability:_write_latency"),
    ("response build", "django.http.response:HttpResponse.__init__"),
]


class Timed:
    """Wraps a callable; accumulates inclusive wall and CPU time per call (re-entrancy safe)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.wall = 0.0
        self.cpu = 0.0
        self.calls = 0
        self.depth = 0

    def wrapper(self):
        timed = self

        def wrapped(*args, **kwargs):
            if timed.depth:
                return timed.fn(*args, **kwargs)
            timed.depth += 1
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return timed.fn(*args, **kwargs)
            finally:
                timed.wall += time.perf_counter() - w0
                timed.cpu += time.process_time() - c0
                timed.calls += 1
                timed.depth -= 1

        wrapped.__wrapped__ = self.fn
        return wrapped


def install(path: str) -> Timed | None:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    owner = module
    parts = attr.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    fn = getattr(owner, parts[-1], None)
    if fn is None:
        return None
    timed = Timed(fn)
    setattr(owner, parts[-1], timed.wrapper())
    return timed


def statement_kind(sql: str) -> str:
    text = " ".join(sql.split()).upper()
    if text.startswith('INSERT INTO "ASSETS_APP_ASSETEVENTQUEUE"'):
        return "INSERT outbox row"
    if text.startswith('WITH ROW AS (INSERT INTO "ASSETS_APP_ASSETEVENTQUEUE"'):
        return "INSERT outbox row (+ enqueued counter)"
    if text.startswith("INSERT INTO ASSETS_APP_METRICCOUNTER") or "METRICCOUNTER" in text:
        return "metric counter upsert"
    if "DJANGO_Q_ORMQ" in text and text.startswith("INSERT"):
        return "INSERT broker task (nudge)"
    if "DJANGO_Q_ORMQ" in text:
        return "SELECT broker tasks (nudge coalescing)"
    if text.startswith('UPDATE "ASSETS_APP_DAGRUN"'):
        return "UPDATE dag run if done"
    if "ASSETS_APP_ASSETDAGRUNQUEUE" in text:
        return "SELECT ADRQ exists"
    if text.startswith('UPDATE "ASSETS_APP_TASKINSTANCE"'):
        return "UPDATE TI"
    if "ASSETS_APP_TASKINSTANCE" in text and "FOR UPDATE" in text:
        return "SELECT TI FOR UPDATE"
    if "ASSETS_APP_TASKINSTANCE" in text:
        return "SELECT TI"
    return text[:60]


class StatementTimer:
    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            kind = statement_kind(sql)
            self.wall[kind] += time.perf_counter() - started
            self.count[kind] += 1


def main() -> None:
    def extra(parser):
        parser.add_argument("--profile", help="write a cProfile of the measured rounds here")
        parser.add_argument("--outlets", type=int, default=OUTLETS)

    args = h.parse_args(__doc__, extra)
    h.record_machine_start()
    url = h.fresh_database(NAME)
    h.setup_django(url)
    import _fixtures as fx
    import psutil
    from django.db import connection

    from assets_app.api.auth import issue_token
    from assets_app.models import TIState

    warmup, rounds = (5, 30) if args.quick else (20, 200)
    rounds = args.rounds or rounds
    outlets_n = args.outlets
    assets = fx.make_assets(outlets_n, prefix="b")
    fx.make_scheduled_dags(assets, count=FANOUT, prefix="consumer")
    producer = fx.make_producer(dag_id="producer", task_id="t", outlets=assets)
    tis = fx.make_tis_in_runs(dag=producer.dag, count=warmup + 3 * rounds, state=TIState.RUNNING)
    outlets = fx.outlets_of(assets)
    bodies = [
        json.dumps(
            {
                "state": "success",
                "end_date": datetime.now(UTC).isoformat(),
                "task_outlets": outlets,
                "outlet_events": [],
            }
        ).encode()
        for _ in tis
    ]
    tokens = [issue_token(ti.id, try_number=ti.try_number) for ti in tis]
    print(f"body: {len(bodies[0]):,} bytes, {outlets_n} outlets", flush=True)

    from project.wsgi import application

    def call(i: int) -> int:
        status: list[str] = []
        environ = {
            "REQUEST_METHOD": "PATCH",
            "PATH_INFO": f"/execution/task-instances/{tis[i].id}/state",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(bodies[i])),
            "HTTP_HOST": "127.0.0.1",
            "HTTP_AUTHORIZATION": f"Bearer {tokens[i]}",
            "wsgi.input": io.BytesIO(bodies[i]),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
        }
        result = application(environ, lambda s, headers, exc=None: status.append(s))
        b"".join(result)
        if hasattr(result, "close"):
            result.close()
        code = int(status[0].split()[0])
        if code != 204:
            raise SystemExit(f"HTTP {status[0]}")
        return code

    for i in range(warmup):
        call(i)
    backend = psutil.Process(connection.connection.info.backend_pid)

    def backend_cpu() -> float:
        t = backend.cpu_times()
        return t.user + t.system

    # Round set 1: plain, for the totals.
    web_cpu, web_wall, pg_cpu = [], [], []
    for i in range(warmup, warmup + rounds):
        b0, c0, w0 = backend_cpu(), time.process_time(), time.perf_counter()
        call(i)
        web_wall.append((time.perf_counter() - w0) * 1000)
        web_cpu.append((time.process_time() - c0) * 1000)
        pg_cpu.append((backend_cpu() - b0) * 1000)
    # psutil's CPU times tick at 10 ms: per request they are 0 or 10, so use the mean.
    pg_mean = statistics.fmean(pg_cpu)

    # Round set 2: with component timers and the statement timer.
    timers = {label: install(path) for label, path in COMPONENTS}
    statements = StatementTimer()
    connection.execute_wrappers.append(statements)
    start = warmup + rounds
    for i in range(start, start + rounds):
        call(i)
    connection.execute_wrappers.remove(statements)
    if args.profile:
        # Round set 3: cProfile alone (it slows the code down several times: shares only).
        for timed in timers.values():
            if timed is not None:
                timed.depth = 1  # pass-through
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        for i in range(start + rounds, start + 2 * rounds):
            call(i)
        profiler.disable()
        profiler.dump_stats(args.profile)
        print(f"wrote {args.profile}")

    web = h.stats(web_cpu)
    h.print_table(
        f"one success, {outlets_n} outlets, in-process WSGI ({rounds} requests after {warmup} "
        "warm-up; totals from the untimed rounds)",
        ["measure", "median ms", "mean ms", "p90 ms"],
        [
            ["web CPU per request", web["median"], web["mean"], web["p90"]],
            ["web wall per request", statistics.median(web_wall), statistics.fmean(web_wall), ""],
            ["PostgreSQL backend CPU per request (mean)", "", pg_mean, ""],
        ],
    )
    rows = []
    components = {}
    for label, _ in COMPONENTS:
        timed = timers[label]
        if timed is None or not timed.calls:
            rows.append([label, "-", "-", "-"])
            continue
        cpu = timed.cpu / rounds * 1000
        wall = timed.wall / rounds * 1000
        rows.append([label, cpu, wall, timed.calls / rounds])
        components[label] = {
            "cpu_ms": cpu,
            "wall_ms": wall,
            "calls_per_request": timed.calls / rounds,
        }
    h.print_table(
        "components, inclusive, per request (timed rounds; timers add ~2 us per call)",
        ["component", "web CPU ms", "wall ms", "calls"],
        rows,
    )
    stmt_rows = sorted(statements.wall.items(), key=lambda kv: -kv[1])
    h.print_table(
        "SQL statements per request: wall time at the client (PostgreSQL + loopback)",
        ["statement", "ms", "per request"],
        [[k, v / rounds * 1000, statements.count[k] / rounds] for k, v in stmt_rows],
    )
    h.write_results(
        NAME,
        {
            "outlets": outlets_n,
            "fanout": FANOUT,
            "rounds": rounds,
            "warmup": warmup,
            "body_bytes": len(bodies[0]),
            "web_cpu_ms": web,
            "web_wall_ms": h.stats(web_wall),
            "postgres_backend_cpu_ms_mean": pg_mean,
            "components": components,
            "statements": {
                k: {"ms": v / rounds * 1000, "per_request": statements.count[k] / rounds}
                for k, v in stmt_rows
            },
        },
        args,
    )
    connection.close()
    if not args.keep_db:
        h.drop_database(NAME)


if __name__ == "__main__":
    main()
