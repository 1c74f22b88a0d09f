"""Drive our public API (`/api/v2/`) with Airflow's official REST client (apache-airflow-client
3.3.2), unmodified, as a user's script would: every response goes through the client's own
pydantic models. Runs in `.venv-airflow-client` (see airflow_env.py), started by
test_airflow_client.py against a live server holding the Dags of that test (`client_producer`:
extract -> asset client-orders, alias client-cleaned; load; `client_consumer` on client-orders).
Each check prints one line; exit status 0 when all passed. Variables and connections are another
issue's (not checked here).

The worker part (finishing TIs so a run ends) uses our execution API with plain urllib3.
"""

import argparse
import json
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import airflow_client.client as af
import urllib3
from airflow_client.client.exceptions import (
    ApiException,
    BadRequestException,
    NotFoundException,
    UnprocessableEntityException,
)

FAILED: list[str] = []
PASSED: list[str] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    (PASSED if ok else FAILED).append(name)
    print(
        f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail != '' else ''}", flush=True
    )


def expect(name: str, exc_type: type[ApiException], call) -> ApiException | None:
    try:
        call()
    except exc_type as exc:
        check(name, True, f"HTTP {exc.status}")
        return exc
    except Exception as exc:
        check(name, False, f"{type(exc).__name__}: {exc}")
        return None
    check(name, False, "no error raised")
    return None


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


class Worker:
    """Claims and finishes TIs through our worker API, like the reference worker."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url = url
        self.api_key = api_key
        self.http = urllib3.PoolManager()

    def _call(self, method: str, path: str, body: dict, token: str) -> urllib3.BaseHTTPResponse:
        return self.http.request(
            method,
            f"{self.url}{path}",
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

    def claim(self) -> list[dict]:
        """Every claimable TI, claimed (each stays ours until run or the claim times out)."""
        workloads: list[dict] = []
        for _ in range(3):
            response = self._call(
                "POST",
                "/execution/workloads/claim",
                {"hostname": "client-check", "limit": 50},
                self.api_key,
            )
            workloads += json.loads(response.data)["workloads"]
            time.sleep(0.2)
        return workloads

    def succeed(self, workload: dict) -> None:
        ti, token = workload["ti"], workload["token"]
        start = {
            "state": "running",
            "hostname": "client-check",
            "unixname": "check",
            "pid": 4242,
            "start_date": datetime.now(UTC).isoformat(),
        }
        self._call("PATCH", f"/execution/task-instances/{ti['id']}/run", start, token)
        success = {
            "state": "success",
            "end_date": datetime.now(UTC).isoformat(),
            "task_outlets": workload["task_outlets"],
            "outlet_events": [],
        }
        self._call("PATCH", f"/execution/task-instances/{ti['id']}/state", success, token)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--worker-api-key", required=True)
    args = parser.parse_args()

    config = af.Configuration(host=args.url, access_token=args.token)
    api = af.ApiClient(config)
    assets, dags, runs = af.AssetApi(api), af.DAGApi(api), af.DagRunApi(api)
    tis, monitor, version = af.TaskInstanceApi(api), af.MonitorApi(api), af.VersionApi(api)
    worker = Worker(args.url, args.worker_api_key)

    # --- version and health ----------------------------------------------------------------
    info = version.get_version()
    check("get_version", info.version == "3.3.2", info.version)
    health = monitor.get_health()
    check("get_health", health.metadatabase.status == "healthy", health.metadatabase.status)

    # --- Dags -----------------------------------------------------------------------------
    listed = dags.get_dags(dag_id_pattern="client_", order_by=["-dag_id"])
    check(
        "get_dags(dag_id_pattern, order_by)",
        [d.dag_id for d in listed.dags] == ["client_producer", "client_consumer"]
        and listed.total_entries == 2,
        [d.dag_id for d in listed.dags],
    )
    consumer = dags.get_dag("client_consumer")
    check(
        "get_dag",
        consumer.timetable_summary == "Asset" and consumer.is_paused is False,
        consumer.timetable_summary,
    )
    details = dags.get_dag_details("client_consumer")
    check(
        "get_dag_details(asset_expression)",
        details.asset_expression
        == {"asset": {"uri": "s3://client/orders", "name": "client-orders", "group": "asset"}},
        details.asset_expression,
    )
    producer = dags.get_dag_details("client_producer")
    check(
        "get_dag_details(tags, owners, doc_md)",
        [t.name for t in producer.tags] == ["client", "etl"]
        and producer.owners == ["airflow", "data-eng"]
        and producer.doc_md == "# Producer\nExtracts and loads.",
        (producer.tags, producer.owners, producer.doc_md),
    )
    tagged = dags.get_dags(tags=["etl", "nope"], tags_match_mode="any", owners=["DATA"])
    check("get_dags(tags, owners)", [d.dag_id for d in tagged.dags] == ["client_producer"])
    both = dags.get_dags(tags=["etl", "nope"], tags_match_mode="all")
    check("get_dags(tags_match_mode=all)", both.total_entries == 0, both.total_entries)

    # --- tasks of a Dag (issue 39) -----------------------------------------------------------
    task_api = af.TaskApi(api)
    listed_tasks = task_api.get_tasks("client_producer", order_by="-task_id")
    first = listed_tasks.tasks[0] if listed_tasks.tasks else None
    check(
        "get_tasks(order_by)",
        [t.task_id for t in listed_tasks.tasks] == ["load", "extract"]
        and listed_tasks.total_entries == 2
        and first is not None
        and first.pool == "default_pool"
        and first.retry_delay.seconds == 300,
        [t.task_id for t in listed_tasks.tasks],
    )
    extract = task_api.get_task("client_producer", "extract")
    check(
        "get_task",
        (extract.owner, extract.retries, extract.trigger_rule, extract.is_mapped)
        == ("data-eng", 1, "all_success", False),
        extract,
    )
    expect("get_task(unknown task)", NotFoundException, lambda: task_api.get_task("~", "x"))
    expect(
        "get_tasks(order_by=unknown)",
        BadRequestException,
        lambda: task_api.get_tasks("client_producer", order_by="nope"),
    )

    paused = dags.patch_dag("client_consumer", af.DAGPatchBody(is_paused=True))
    check("patch_dag(pause)", paused.is_paused is True)
    check("get_dag shows the pause", dags.get_dag("client_consumer").is_paused is True)
    check(
        "get_dags(paused=True)",
        [d.dag_id for d in dags.get_dags(paused=True, dag_id_pattern="client").dags]
        == ["client_consumer"],
    )

    # --- assets and aliases ----------------------------------------------------------------
    found = assets.get_assets(name_pattern="client-ord")
    asset = found.assets[0] if found.assets else None
    check(
        "get_assets(name_pattern)",
        found.total_entries == 1
        and asset.uri == "s3://client/orders"
        and [d.dag_id for d in asset.scheduled_dags] == ["client_consumer"]
        and [(t.dag_id, t.task_id) for t in asset.producing_tasks]
        == [("client_producer", "extract")],
        found.total_entries,
    )
    asset_id = asset.id
    check("get_asset", assets.get_asset(asset_id).name == "client-orders")
    aliases = assets.get_asset_aliases(name_pattern="client-")
    check(
        "get_asset_aliases",
        [a.name for a in aliases.asset_aliases] == ["client-cleaned"],
        [a.name for a in aliases.asset_aliases],
    )
    alias_id = aliases.asset_aliases[0].id
    alias = assets.get_asset_alias(alias_id)
    check("get_asset_alias", (alias or {}).get("name") == "client-cleaned", alias)

    # --- events while the consumer is paused: they queue ------------------------------------
    first = assets.create_asset_event(
        af.CreateAssetEventsBody(asset_id=asset_id, extra={"batch": 1})
    )
    check(
        "create_asset_event",
        first.extra == {"batch": 1, "from_rest_api": True} and first.asset_id == asset_id,
        first.extra,
    )
    by_name = assets.get_asset_events(name_pattern="client-ord", order_by=["-timestamp"])
    check(
        "get_asset_events(name_pattern)",
        [e.id for e in by_name.asset_events] == [first.id],
        [e.id for e in by_name.asset_events],
    )
    after = assets.get_asset_events(asset_id=asset_id, timestamp_gt=first.timestamp)
    upto = assets.get_asset_events(asset_id=asset_id, timestamp_lte=first.timestamp)
    check(
        "get_asset_events(timestamp_gt / timestamp_lte)",
        after.total_entries == 0 and [e.id for e in upto.asset_events] == [first.id],
        (after.total_entries, upto.total_entries),
    )
    queued = assets.get_dag_asset_queued_events("client_consumer")
    check(
        "get_dag_asset_queued_events",
        [(q.dag_id, q.asset_id) for q in queued.queued_events] == [("client_consumer", asset_id)],
    )
    one = assets.get_dag_asset_queued_event("client_consumer", asset_id)
    check(
        "get_dag_asset_queued_event", one.asset_id == asset_id and one.dag_id == "client_consumer"
    )
    per_asset = assets.get_asset_queued_events(asset_id)
    check(
        "get_asset_queued_events",
        [q.dag_id for q in per_asset.queued_events] == ["client_consumer"],
    )
    assets.delete_dag_asset_queued_event("client_consumer", asset_id)
    expect(
        "delete_dag_asset_queued_event, then get -> 404",
        NotFoundException,
        lambda: assets.get_dag_asset_queued_event("client_consumer", asset_id),
    )
    assets.create_asset_event(af.CreateAssetEventsBody(asset_id=asset_id, extra={"batch": 2}))
    assets.delete_asset_queued_events(asset_id)
    check(
        "delete_asset_queued_events",
        assets.get_asset_queued_events(asset_id).total_entries == 0,
    )
    assets.create_asset_event(af.CreateAssetEventsBody(asset_id=asset_id, extra={"batch": 3}))
    assets.delete_dag_asset_queued_events("client_consumer")
    check(
        "delete_dag_asset_queued_events",
        assets.get_dag_asset_queued_events("client_consumer").total_entries == 0,
    )

    # --- unpause: the next event triggers the consumer --------------------------------------
    unpaused = dags.patch_dags(af.DAGPatchBody(is_paused=False), dag_id_pattern="client_consumer")
    check(
        "patch_dags(unpause)",
        [(d.dag_id, d.is_paused) for d in unpaused.dags] == [("client_consumer", False)],
    )
    trigger_event = assets.create_asset_event(
        af.CreateAssetEventsBody(asset_id=asset_id, extra={"batch": 4})
    )
    consumer_runs = wait_for(lambda: runs.get_dag_runs("client_consumer").dag_runs)
    run = consumer_runs[0] if consumer_runs else None
    check(
        "asset-triggered run found by get_dag_runs",
        run is not None and run.run_type == "asset_triggered" and run.triggered_by == "asset",
        run and (run.run_type, run.triggered_by),
    )
    if run is None:
        return report()
    upstream = runs.get_upstream_asset_events("client_consumer", run.dag_run_id)
    check(
        "get_upstream_asset_events",
        [e.id for e in upstream.asset_events] == [trigger_event.id],
        [e.id for e in upstream.asset_events],
    )
    consumed = assets.get_asset_events(asset_id=asset_id, order_by=["-id"], limit=1).asset_events[0]
    refs = consumed.created_dagruns
    check(
        "get_asset_events lists the consuming run (triggering)",
        [(r.dag_id, r.run_id, r.triggering) for r in refs]
        == [("client_consumer", run.dag_run_id, True)],
        refs,
    )

    # --- a manual run, its task instances, wait, clear --------------------------------------
    triggered = runs.trigger_dag_run(
        "client_producer",
        af.TriggerDAGRunPostBody(logical_date=None, conf={"day": 3}, note="from the client"),
    )
    again = runs.get_dag_run("client_producer", triggered.dag_run_id)
    check(
        "trigger_dag_run, then get_dag_run",
        (again.dag_run_id, again.conf, again.note, again.triggered_by, again.state)
        == (triggered.dag_run_id, {"day": 3}, "from the client", "rest_api", "queued"),
        (again.state, again.triggered_by),
    )
    every = runs.get_dag_runs("~", run_id_pattern=triggered.dag_run_id[-8:], run_type=["manual"])
    check(
        "get_dag_runs(~, run_id_pattern, run_type)",
        [r.dag_run_id for r in every.dag_runs] == [triggered.dag_run_id],
    )
    page1 = runs.get_dag_runs("~", cursor="", limit=1, order_by=["id"])
    page2 = runs.get_dag_runs("~", cursor=page1.next_cursor, limit=1, order_by=["id"])
    check(
        "get_dag_runs(cursor)",
        page1.next_cursor is not None
        and page2.dag_runs[0].dag_run_id != page1.dag_runs[0].dag_run_id
        and page2.previous_cursor is not None,
        (page1.total_entries, page1.total_entries_limit),
    )
    batch = runs.get_list_dag_runs_batch(
        "~", af.DAGRunsBatchBody(dag_ids=["client_producer"], states=["queued"])
    )
    check(
        "get_list_dag_runs_batch",
        [r.dag_run_id for r in batch.dag_runs] == [triggered.dag_run_id],
    )
    listed_tis = tis.get_task_instances("client_producer", triggered.dag_run_id)
    check(
        "get_task_instances",
        sorted((t.task_id, t.state.value, t.try_number) for t in listed_tis.task_instances)
        == [("extract", "queued", 1), ("load", "queued", 1)],
    )
    extract = tis.get_task_instance("client_producer", triggered.dag_run_id, "extract")
    check(
        "get_task_instance",
        extract.max_tries == 1
        and extract.pool == "default_pool"
        and extract.state.value == "queued",
    )
    mapped = tis.get_mapped_task_instance("client_producer", triggered.dag_run_id, "load", -1)
    check("get_mapped_task_instance", mapped.task_id == "load")
    tis_batch = tis.get_task_instances_batch(
        "~", "~", af.TaskInstancesBatchBody(dag_ids=["client_producer"], task_ids=["load"])
    )
    check(
        "get_task_instances_batch",
        [t.dag_run_id for t in tis_batch.task_instances] == [triggered.dag_run_id],
    )

    claimed = {
        w["ti"]["task_id"]: w for w in worker.claim() if w["ti"]["run_id"] == triggered.dag_run_id
    }
    check(
        "worker claimed extract and load", sorted(claimed) == ["extract", "load"], sorted(claimed)
    )
    worker.succeed(claimed["extract"])
    lines: list[dict] = []

    def wait() -> None:
        response = runs.wait_dag_run_until_finished_without_preload_content(
            "client_producer", triggered.dag_run_id, interval=0.2
        )
        for line in response.data.decode().splitlines():
            lines.append(json.loads(line))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    worker.succeed(claimed["load"])
    waiter.join(timeout=30)
    check(
        "wait_dag_run_until_finished (NDJSON)",
        lines and lines[0]["state"] in ("queued", "running") and lines[-1] == {"state": "success"},
        lines,
    )
    done = tis.get_task_instances("client_producer", triggered.dag_run_id, state=["success"])
    check("get_task_instances(state=success)", done.total_entries == 2, done.total_entries)

    # The client's model for a dry run's items is oneOf(TaskInstanceResponse, NewTaskResponse),
    # and a task instance matches both, so it cannot parse this answer (from Airflow either):
    # read it raw, as a script has to.
    dry = json.loads(
        runs.clear_dag_run_without_preload_content(
            "client_producer", triggered.dag_run_id, af.DAGRunClearBody(dry_run=True)
        ).data
    )
    check(
        "clear_dag_run(dry_run)",
        dry["total_entries"] == 2
        and sorted((t["task_id"], t["state"]) for t in dry["task_instances"])
        == [("extract", "success"), ("load", "success")],
        dry["total_entries"],
    )
    cleared = runs.clear_dag_run(
        "client_producer", triggered.dag_run_id, af.DAGRunClearBody(dry_run=False)
    ).actual_instance
    check(
        "clear_dag_run -> run queued again",
        cleared.state.value == "queued" and cleared.end_date is None,
        cleared.state,
    )
    retried = tis.get_task_instance("client_producer", triggered.dag_run_id, "extract")
    check(
        "cleared TI: a new try, queued",
        (retried.try_number, retried.state.value, retried.max_tries) == (2, "queued", 2),
        (retried.try_number, retried.state, retried.max_tries),
    )

    materialized = assets.materialize_asset(asset_id)
    check(
        "materialize_asset",
        (materialized.dag_id, materialized.run_type.value)
        == ("client_producer", "asset_materialization"),
        materialized.run_type,
    )

    # --- errors in Airflow's shapes ---------------------------------------------------------
    missing = expect("get_dag(unknown) -> 404", NotFoundException, lambda: dags.get_dag("nope"))
    if missing is not None:
        check(
            "404 body parsed (HTTPExceptionResponse)",
            missing.data is not None
            and missing.data.detail.actual_instance["reason"] == "dag_not_found",
        )
    bad_order = expect(
        "get_asset_events(order_by=bogus) -> 400",
        BadRequestException,
        lambda: assets.get_asset_events(order_by=["bogus"]),
    )
    if bad_order is not None:
        # Airflow documents no 400 for this call, so the client leaves the body unparsed.
        detail = json.loads(bad_order.body)["detail"]
        check(
            "400 names the field",
            detail["reason"] == "invalid_order_by" and "'bogus'" in detail["message"],
        )
    invalid = expect(
        "get_dag_runs(state=bogus) -> 422",
        UnprocessableEntityException,
        lambda: runs.get_dag_runs("~", state=["bogus"]),
    )
    if invalid is not None:
        first_error = invalid.data.detail[0]
        check(
            "422 body parsed (HTTPValidationError)",
            "Invalid value for state" in first_error.msg
            and first_error.loc[0].actual_instance == "query",
            first_error.msg,
        )
    expect(
        "trigger_dag_run(unknown dag) -> 404",
        NotFoundException,
        lambda: runs.trigger_dag_run("nope", af.TriggerDAGRunPostBody(logical_date=None)),
    )
    stale = datetime.now(UTC) + timedelta(days=1)
    check(
        "get_dag_runs(run_after_gte tomorrow) is empty",
        runs.get_dag_runs("~", run_after_gte=stale).total_entries == 0,
    )
    return report()


def report() -> int:
    print(f"{len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
