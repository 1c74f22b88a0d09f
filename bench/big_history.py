"""A year of history (issue 48): the console's pages and the public API's lists on a big database.

Seeds database bench_history ($BENCH_DB_PREFIX_history) with INSERT ... SELECT generate_series,
deterministically (no random(): ids, names and times are functions of the series), at --scale 1
the size of a busy Airflow site after a year: 5,000 Dags of 10 chained tasks, 20,000 assets
(each Dag produces 4 through its first task and is scheduled on 2 of its predecessor's), 300,000
runs (60 per Dag, 1 in 20 failed) over the 365 days before 2026-12-01, 3,000,000 TIs (10 per
run), 2,000,000 asset events (from the Dag producing their asset), 300,000 consumed-event links
(one per run), 843,572 XComs, 229,178 log chunks and 50,000 audit entries, then ANALYZE. The
outbox and the ADRQ are left empty (their pages are small at any size). A second database,
bench_history_empty, gets the same seed at --empty-scale (a handful of rows, so every detail
page has an object to show): the "empty" column.

Then, in this process through Django's test client (a logged-in superuser; the public API by its
staff session), each page is requested once cold (the first request after the switch to that
database, layout cache emptied) and --rounds times warm (default 5): every console list plain,
searched, filtered, sorted by each column it offers (introspected from the ChangeList), and at a
deep page; the Dag, grid, run, TI (with its log) and lineage (whole and focused) pages; the
public API lists at their default, at limit 1,000 and at a deep offset. The table gives the warm
median beside the empty database's and the cold time; the JSON (bench/results/big_history.json,
or big_history_<label>.json with --label) holds every sample.

Target (issue 48): every page and request under 300 ms warm at --scale 1; an API request at an
offset of 250,000 or more under 1 s. `--scale 0.1` seeds a tenth (a few minutes on 2 cores);
`--quick` is --scale 0.01 with 2 warm rounds. `--reuse` keeps both databases from a previous run
(`--keep-db`) and only measures (an A/B of two checkouts on the same rows: run the other with
`--reuse --label before`).
"""

from __future__ import annotations

import time

import _harness as h

NAME = "history"
TARGET_MS = 300.0
TARGET_DEEP_API_MS = 1000.0
ANCHOR = "timestamptz '2026-12-01 00:00:00+00'"
FULL = {
    "dags": 5_000,
    "tasks_per_dag": 10,
    "assets_per_dag": 4,
    "runs": 300_000,
    "events": 2_000_000,
    "xcoms": 843_572,
    "log_chunks": 229_178,
    "audit": 50_000,
}
# Deep pages at full size (scaled with the rows): the runs / events / TIs pages and
# its API offset.
DEEP = {"runs_page": 1_000, "events_page": 5_000, "tis_page": 10_000, "api_offset": 1_000_000}


def sizes(scale: float) -> dict[str, int]:
    out = {key: max(1, int(value * scale)) for key, value in FULL.items()}
    out["dags"] = max(10, out["dags"])  # dag_7 is every detail page's
    out["tasks_per_dag"] = FULL["tasks_per_dag"]
    out["assets_per_dag"] = FULL["assets_per_dag"]
    return out


def seed(cursor, n: dict[str, int]) -> dict[str, float]:
    """Fill a migrated, empty database; seconds per table."""
    timings: dict[str, float] = {}
    dags, tasks, per_dag = n["dags"], n["tasks_per_dag"], n["assets_per_dag"]
    assets, runs = dags * per_dag, n["runs"]
    tis = runs * tasks

    def timed(label: str, statement: str, params: tuple = ()) -> None:
        started = time.monotonic()
        cursor.execute(statement, params)
        timings[label] = round(time.monotonic() - started, 1)

    timed(
        "dags",
        "INSERT INTO assets_app_dag (dag_id, description, is_paused, max_active_runs, fileloc, "
        "created_at, updated_at, max_active_tasks) SELECT 'dag_' || g, 'seeded Dag ' || g, "
        "g %% 10 = 9, 16, '/dags/team_' || (g %% 50) || '/dag_' || g || '.py', "
        f"{ANCHOR} - interval '400 days', {ANCHOR}, 16 FROM generate_series(0, %s) g",
        (dags - 1,),
    )
    timed(
        "tasks",
        "INSERT INTO assets_app_task (task_id, retries, dag_id, retry_delay_seconds, "
        "retry_exponential_backoff, trigger_rule, map_upstream, map_group, priority_weight, "
        "priority_weight_total, weight_rule, pool, pool_slots, queue) SELECT 't' || k, 0, "
        "'dag_' || g, 300, 0, 'all_success', '', '', 1, 1, 'downstream', 'default_pool', 1, "
        "'default' FROM generate_series(0, %s) g, generate_series(0, %s) k ORDER BY g, k",
        (dags - 1, tasks - 1),
    )
    timed(
        "task_upstreams",
        "INSERT INTO assets_app_taskupstream (task_id, upstream_id) SELECT t.id, u.id "
        "FROM assets_app_task t JOIN assets_app_task u ON u.dag_id = t.dag_id "
        "AND u.task_id = 't' || (substr(t.task_id, 2)::int - 1) WHERE t.task_id <> 't0'",
    )
    timed(
        "assets",
        'INSERT INTO assets_app_asset (name, uri, "group", extra, created_at, updated_at) '
        "SELECT 'asset_' || g, 's3://warehouse/team_' || (g %% 50) || '/table_' || g, 'asset', "
        f"'{{}}', {ANCHOR} - interval '400 days', {ANCHOR} FROM generate_series(0, %s) g",
        (assets - 1,),
    )
    timed(
        "outlet_refs",
        "INSERT INTO assets_app_taskoutletassetreference (task_id, asset_id) SELECT t.id, a.id "
        "FROM assets_app_task t JOIN assets_app_asset a ON a.name LIKE 'asset\\_%%' "
        "AND substr(a.name, 7)::int / %s = substr(t.dag_id, 5)::int WHERE t.task_id = 't0'",
        (per_dag,),
    )
    # Dag g (g > 0) is scheduled on the first two assets of Dag g - 1: chains of 5,000.
    timed(
        "schedule_refs",
        "INSERT INTO assets_app_dagscheduleassetreference (dag_id, asset_id) "
        "SELECT 'dag_' || (substr(a.name, 7)::int / %s + 1), a.id FROM assets_app_asset a "
        "WHERE substr(a.name, 7)::int %% %s < 2 AND substr(a.name, 7)::int / %s + 1 < %s",
        (per_dag, per_dag, per_dag, dags),
    )
    timed(
        "runs",
        "INSERT INTO assets_app_dagrun (dag_id, run_id, run_type, state, run_after, "
        "logical_date, data_interval_start, data_interval_end, start_date, end_date, "
        "clear_number, queued_at, conf, created_at, triggered_by) SELECT 'dag_' || (g %% %s), "
        "'scheduled__' || to_char(t, 'YYYY-MM-DD\"T\"HH24:MI:SS') || '+00:00', 'scheduled', "
        "CASE WHEN g %% 20 = 7 THEN 'failed' ELSE 'success' END, t, t, t - interval '1 day', "
        "t, t, t + interval '90 seconds', 0, t, '{}', t, 'timetable' "
        "FROM generate_series(0, %s) g, "
        f"LATERAL (SELECT {ANCHOR} - interval '365 days' * (1 - g::float / %s) AS t) x "
        "ORDER BY g",
        (dags, runs - 1, runs),
    )
    timed(
        "task_instances",
        "INSERT INTO assets_app_taskinstance (id, dag_run_id, dag_id, run_id, task_id, "
        "map_index, try_number, max_tries, state, hostname, unixname, queued_at, start_date, "
        "end_date, claimed_by, updated_at) SELECT md5('ti:' || r.id || ':' || k)::uuid, r.id, "
        "r.dag_id, r.run_id, 't' || k, -1, 1, 0, CASE WHEN r.state = 'failed' AND k = 9 "
        "THEN 'failed' ELSE 'success' END, 'worker-' || (r.id %% 8), 'airflow', r.run_after, "
        "r.run_after + k * interval '8 seconds', r.run_after + (k + 1) * interval '8 seconds', "
        "'', r.end_date FROM assets_app_dagrun r, generate_series(0, %s) k ORDER BY r.id, k",
        (tasks - 1,),
    )
    # Event g: asset g % assets, produced by that asset's Dag, spread over the year.
    timed(
        "events",
        "INSERT INTO assets_app_assetevent (asset_id, extra, timestamp, source_dag_id, "
        "source_task_id, source_run_id, source_map_index, source_ordinal) SELECT "
        "(SELECT min(id) FROM assets_app_asset) + g %% %s, '{}', "
        f"{ANCHOR} - interval '365 days' * (1 - g::float / %s), "
        "'dag_' || ((g %% %s) / %s), 't0', NULL, -1, 0 FROM generate_series(0, %s) g ORDER BY g",
        (assets, n["events"], assets, per_dag, n["events"] - 1),
    )
    timed(
        "consumed_links",
        "INSERT INTO assets_app_dagrunassetevent (dag_run_id, dag_id, asset_event_id) "
        "SELECT r.id, r.dag_id, (SELECT min(id) FROM assets_app_assetevent) "
        "+ (r.id * 7) %% %s FROM assets_app_dagrun r ORDER BY r.id",
        (n["events"],),
    )
    timed(
        "xcoms",
        "INSERT INTO assets_app_xcom (dag_id, run_id, task_id, map_index, key, value, "
        "timestamp) SELECT dag_id, run_id, task_id, -1, 'return_value', "
        "jsonb_build_object('rows', dag_run_id, 'task', task_id), end_date "
        "FROM assets_app_taskinstance ORDER BY dag_run_id DESC, task_id LIMIT %s",
        (min(n["xcoms"], tis),),
    )
    timed(
        "log_chunks",
        'INSERT INTO assets_app_tasklogchunk (ti_id, try_number, "offset", size, content, '
        "created_at) SELECT id, 1, 0, 160, "
        '\'{"timestamp": "\' || to_char(start_date, \'YYYY-MM-DD"T"HH24:MI:SS\') || '
        '\'Z", "level": "info", "event": "seeded log line of \' || task_id || \'"}\' '
        "|| chr(10), end_date FROM assets_app_taskinstance ORDER BY dag_run_id DESC, task_id "
        "LIMIT %s",
        (min(n["log_chunks"], tis),),
    )
    timed(
        "audit",
        "INSERT INTO assets_app_auditentry (at, actor_name, via, action, summary, dag_id, "
        "row_count, detail) SELECT "
        f"{ANCHOR} - interval '365 days' * (1 - g::float / %s), 'ops', 'admin', "
        "CASE WHEN g %% 2 = 0 THEN 'dag.pause' ELSE 'dag.unpause' END, "
        "'paused dag_' || (g %% %s), 'dag_' || (g %% %s), 1, '{}' "
        "FROM generate_series(0, %s) g ORDER BY g",
        (n["audit"], dags, dags, n["audit"] - 1),
    )
    timed("analyze", "VACUUM ANALYZE")
    return timings


def pages(scale: float, world: dict) -> list[tuple[str, str, dict]]:
    """(label, path, GET params) of every page and request measured; `world` names objects."""
    from django.contrib.admin.sites import site
    from django.test import RequestFactory
    from django.urls import reverse

    from assets_app import models as m

    def changelist(model) -> str:
        return reverse(f"admin:assets_app_{model._meta.model_name}_changelist")

    def sorts(model) -> list[tuple[str, dict]]:
        """?o=i for every column the ChangeList offers to sort by, descending first as a click
        on a column header gives (for a date: newest first)."""
        request = RequestFactory().get(changelist(model))
        request.user = world["user"]
        cl = site._registry[model].get_changelist_instance(request)
        return [
            (f"sorted by {name}", {"o": f"-{i}"})
            for i, name in enumerate(cl.list_display)
            if cl.get_ordering_field(name) is not None
        ]

    def deep(full_page: int) -> int:
        return max(2, int(full_page * scale))

    lists = {
        m.Dag: [("searched", {"q": "dag_4"}), ("filtered", {"is_paused__exact": "1"})],
        m.Asset: [("searched", {"q": "table_42"})],
        m.DagRun: [
            ("searched by run id", {"q": world["run_id"]}),
            ("filtered by Dag", {"dag__dag_id__exact": "dag_7"}),
            ("filtered by state", {"state__exact": "failed"}),
            (f"page {deep(DEEP['runs_page'])}", {"p": deep(DEEP["runs_page"])}),
        ],
        m.TaskInstance: [
            ("searched by TI id", {"q": world["ti_id"]}),
            ("searched by Dag id", {"q": "dag_7"}),
            ("filtered by Dag", {"dag_id__exact": "dag_7"}),
            ("filtered by state", {"state__exact": "failed"}),
            (f"page {deep(DEEP['tis_page'])}", {"p": deep(DEEP["tis_page"])}),
        ],
        m.AssetEvent: [
            ("searched by asset name", {"q": "asset_42"}),
            ("filtered by source Dag", {"source_dag_id__exact": "dag_7"}),
            ("filtered consumed", {"consumed": "yes"}),
            (f"page {deep(DEEP['events_page'])}", {"p": deep(DEEP["events_page"])}),
        ],
        m.XCom: [("searched by Dag id", {"q": "dag_7"})],
        m.TaskLogChunk: [("searched by TI id", {"q": world["ti_id"]})],
        m.AuditEntry: [("searched", {"q": "dag_7"})],
    }
    out: list[tuple[str, str, dict]] = []
    for model, variants in lists.items():
        name = model._meta.verbose_name_plural
        path = changelist(model)
        out.append((f"{name}: plain", path, {}))
        out += [(f"{name}: {label}", path, params) for label, params in variants]
        out += [(f"{name}: {label}", path, params) for label, params in sorts(model)]
    lineage = reverse("admin:assets_app_dag_lineage")
    out += [
        ("Dag page", reverse("admin:assets_app_dag_change", args=["dag_7"]), {}),
        ("grid", reverse("admin:assets_app_dag_grid", args=["dag_7"]), {}),
        ("run page", reverse("admin:assets_app_dagrun_change", args=[world["run_pk"]]), {}),
        (
            "TI page (with log)",
            reverse("admin:assets_app_taskinstance_change", args=[world["ti_id"]]),
            {},
        ),
        ("lineage (all)", lineage, {}),
        ("lineage focused on a Dag", lineage, {"dag": "dag_7"}),
    ]
    api_offset = max(2, int(DEEP["api_offset"] * scale))
    for label, path in [
        ("dags", "/api/v2/dags"),
        ("runs", "/api/v2/dags/~/dagRuns"),
        ("TIs", "/api/v2/dags/~/dagRuns/~/taskInstances"),
        ("assets", "/api/v2/assets"),
        ("events", "/api/v2/assets/events"),
    ]:
        out.append((f"API {label}", path, {}))
        out.append((f"API {label} limit 1000", path, {"limit": 1000}))
        out.append((f"API {label} offset {api_offset:,}", path, {"offset": api_offset}))
    out.append(("API runs by cursor", "/api/v2/dags/~/dagRuns", {"cursor": ""}))
    out.append(("API runs of one Dag", "/api/v2/dags/dag_7/dagRuns", {}))
    return out


def world_of(user) -> dict:
    """The objects the detail pages show: the newest failed run of dag_7, its failed TI (which
    has a log chunk: chunks go to the newest TIs)."""
    from assets_app.models import DagRun, TaskInstance

    run = DagRun.objects.filter(dag_id="dag_7").order_by("-run_after").first()
    ti = TaskInstance.objects.filter(dag_run=run).order_by("-task_id").first()
    return {"user": user, "run_pk": run.pk, "run_id": run.run_id, "ti_id": str(ti.id)}


def measure(client, todo, rounds: int) -> dict[str, dict]:
    from django.core.cache import cache

    results = {}
    for label, path, params in todo:
        cache.clear()
        samples, status = [], None
        for _ in range(rounds + 1):
            started = time.perf_counter()
            response = client.get(path, params)
            samples.append((time.perf_counter() - started) * 1000.0)
            status = response.status_code
        results[label] = {
            "path": path,
            "params": params,
            "status": status,
            "cold_ms": samples[0],
            "warm_ms": samples[1:],
            "warm_median_ms": h.stats(samples[1:])["median"],
        }
        print(f"  {label}: {results[label]['warm_median_ms']:.0f} ms ({status})", flush=True)
    return results


def use_database(url: str) -> None:
    """Point Django's default connection at another database of the same schema."""
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = url.rsplit("/", 1)[1]


def main() -> None:
    def extra(parser):
        parser.add_argument("--scale", type=float, default=1.0, help="fraction of full size")
        parser.add_argument("--empty-scale", type=float, default=0.0002, help="the empty column")
        parser.add_argument("--reuse", action="store_true", help="measure a kept database")
        parser.add_argument("--label", default="", help="results file big_history_<label>.json")
        parser.add_argument(
            "--only",
            default="",
            help="measure only labels containing one of these (comma-separated)",
        )

    args = h.parse_args(__doc__, extra)
    scale = 0.01 if args.quick else args.scale
    rounds = args.rounds or (2 if args.quick else 5)
    h.record_machine_start()
    seeded: dict[str, dict] = {}
    if args.reuse:
        big, empty = h.db_url(NAME), h.db_url(f"{NAME}_empty")
    else:
        import psycopg

        big, empty = h.fresh_database(NAME), h.fresh_database(f"{NAME}_empty")
        for url, at in ((empty, args.empty_scale), (big, scale)):
            with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
                started = time.monotonic()
                seeded[url] = {"sizes": sizes(at), "seconds": seed(cursor, sizes(at))}
                seeded[url]["total_seconds"] = round(time.monotonic() - started, 1)
                print(f"seeded {url.rsplit('/', 1)[1]}: {seeded[url]}", flush=True)
    h.setup_django(big)
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()  # lets the test client's host through ALLOWED_HOSTS
    measured = {}
    for which, url in (("empty", empty), ("big", big)):
        use_database(url)
        users = get_user_model().objects
        user = users.filter(username="bench").first() or users.create_superuser(
            username="bench", password="bench-pw"
        )
        client = Client()
        client.force_login(user)
        world = world_of(user)
        todo = pages(scale, world)
        if args.only:
            wanted = [part for part in args.only.split(",") if part]
            todo = [page for page in todo if any(part in page[0] for part in wanted)]
        client.get(todo[0][1])  # URL conf import, template loading: not counted
        print(f"{which}:", flush=True)
        measured[which] = measure(client, todo, rounds)

    rows = []
    for label, big_row in measured["big"].items():
        empty_row = measured["empty"].get(label, {})
        target = TARGET_DEEP_API_MS if "offset" in label else TARGET_MS
        rows.append(
            [
                label,
                empty_row.get("warm_median_ms", "-"),
                big_row["warm_median_ms"],
                big_row["cold_ms"],
                big_row["status"],
                "yes" if big_row["warm_median_ms"] < target else "NO",
            ]
        )
    missed = sum(1 for row in rows if row[-1] == "NO")
    h.print_table(
        f"a year of history at --scale {scale} (warm median of {rounds} after one cold; "
        f"{missed} of {len(rows)} at or over target)",
        ["page or request", "empty ms", "big ms", "big cold ms", "HTTP", "< target"],
        rows,
    )
    name = "big_history" + (f"_{args.label}" if args.label else "")
    h.write_results(
        name,
        {
            "scale": scale,
            "rounds": rounds,
            "target_ms": TARGET_MS,
            "target_deep_api_ms": TARGET_DEEP_API_MS,
            "seeded": seeded,
            "missed": missed,
            "pages": measured,
        },
        args,
    )
    if not args.keep_db and not args.reuse:
        from django.db import connection

        connection.close()
        h.drop_database(NAME)
        h.drop_database(f"{NAME}_empty")


if __name__ == "__main__":
    main()
