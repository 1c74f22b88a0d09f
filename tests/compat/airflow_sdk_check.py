"""Drive our worker API with the unmodified Airflow Task SDK client (apache-airflow-task-sdk 1.3.2).

Runs in its own virtualenv (see tests/compat/README.md), against a running server. For every
queued TI it can claim (our own claim endpoint, plain httpx), it goes through
`airflow.sdk.api.client.Client` - whose operations parse every response with the SDK's own
pydantic models (extra fields forbidden) - and checks:

  start (TIRunContext) -> replayed start (same host/pid: 200, same context) -> heartbeat ->
  assets.get by name and by uri (AssetResponse) -> asset_events.get (AssetEventsResponse) ->
  succeed with the TI's outlets as AssetProfiles and one outlet event each ->
  heartbeat after success is refused (409 not_running) -> start after success is refused (409).

Exit status 0 when every check passed; each check prints one line.
"""

import argparse
import os
import sys
import uuid
from datetime import UTC, datetime

os.environ.setdefault("AIRFLOW_HOME", "/tmp/airflow-sdk-check-home")

import httpx
from airflow.sdk.api.client import Client, ServerResponseError
from airflow.sdk.api.datamodels._generated import (
    API_VERSION,
    AssetEventsResponse,
    AssetProfile,
    AssetResponse,
    TIRunContext,
)
from airflow.sdk.exceptions import TaskAlreadyRunningError

CHECKS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def expect_error(name: str, call, status: int, reason: str) -> None:
    try:
        call()
    except TaskAlreadyRunningError as exc:
        cause = exc.__cause__
        got = getattr(getattr(cause, "response", None), "status_code", None)
        check(name, got == status, f"TaskAlreadyRunningError (HTTP {got})")
        return
    except ServerResponseError as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {}
        check(
            name,
            exc.response.status_code == status and detail.get("reason") == reason,
            f"HTTP {exc.response.status_code} {detail}",
        )
        return
    check(name, False, "no error raised")


def claim(url: str, api_key: str, limit: int) -> list[dict]:
    response = httpx.post(
        f"{url}/execution/workloads/claim",
        json={"hostname": "airflow-sdk-check", "limit": limit},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["workloads"]


def drive(url: str, workload: dict) -> None:
    ti_id = uuid.UUID(workload["ti"]["id"])
    label = f"{workload['ti']['dag_id']}.{workload['ti']['task_id']}"
    client = Client(base_url=f"{url}/execution/", token=workload["token"])
    pid = os.getpid()

    context = client.task_instances.start(ti_id, pid, datetime.now(UTC))
    check(
        f"{label}: start -> TIRunContext",
        isinstance(context, TIRunContext) and context.dag_run.run_id == workload["ti"]["run_id"],
        f"run {context.dag_run.run_id} state={context.dag_run.state.value} "
        f"run_type={context.dag_run.run_type.value} max_tries={context.max_tries} "
        f"should_retry={context.should_retry} "
        f"consumed_asset_events={len(context.dag_run.consumed_asset_events)}",
    )
    for event in context.dag_run.consumed_asset_events:
        check(
            f"{label}: consumed event parsed",
            bool(event.asset.name),
            f"asset={event.asset.name} from {event.source_dag_id}.{event.source_task_id} "
            f"aliases={[a.name for a in event.source_aliases]} extra={event.extra}",
        )

    again = client.task_instances.start(ti_id, pid, datetime.now(UTC))
    check(
        f"{label}: replayed start (same host/pid) -> 200 TIRunContext",
        again.dag_run.run_id == context.dag_run.run_id,
    )

    client.task_instances.heartbeat(ti_id, pid)
    check(f"{label}: heartbeat -> 204", True)

    outlets = workload["task_outlets"]
    assets = [o for o in outlets if o["type"] == "Asset"]
    for outlet in assets:
        by_name = client.assets.get(name=outlet["name"])
        by_uri = client.assets.get(uri=outlet["uri"])
        check(
            f"{label}: assets.get(name/uri) -> AssetResponse",
            isinstance(by_name, AssetResponse) and by_name == by_uri,
            f"{by_name.name} {by_name.uri} group={by_name.group}",
        )
        events = client.asset_events.get(name=outlet["name"], uri=outlet["uri"])
        check(
            f"{label}: asset_events.get -> AssetEventsResponse",
            isinstance(events, AssetEventsResponse),
            f"{len(events.asset_events)} events of {outlet['name']}",
        )

    profiles = [AssetProfile(**o) for o in outlets]
    outlet_events = [
        {
            "dest_asset_key": {"name": o["name"], "uri": o["uri"]},
            "extra": {"written_by": "airflow-sdk-check"},
        }
        for o in assets
    ] + [
        {
            "source_alias_name": o["name"],
            "dest_asset_key": {"name": f"{o['name']}-sdk", "uri": f"sdk-check://{o['name']}"},
            "dest_asset_extra": {},
            "extra": {"written_by": "airflow-sdk-check"},
        }
        for o in outlets
        if o["type"] == "AssetAlias"
    ]
    client.task_instances.succeed(
        ti_id, datetime.now(UTC), profiles, outlet_events, rendered_map_index=None
    )
    check(f"{label}: succeed with {len(profiles)} outlets -> 204", True)
    client.task_instances.succeed(
        ti_id, datetime.now(UTC), profiles, outlet_events, rendered_map_index=None
    )
    check(f"{label}: replayed succeed -> 200", True)

    expect_error(
        f"{label}: heartbeat after success -> 409 not_running",
        lambda: client.task_instances.heartbeat(ti_id, pid),
        409,
        "not_running",
    )
    expect_error(
        f"{label}: start after success -> 409 invalid_state",
        lambda: client.task_instances.start(ti_id, pid + 1, datetime.now(UTC)),
        409,
        "invalid_state",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=os.environ.get("WORKER_API_KEY", "dev-worker-api-key"))
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()

    import airflow.sdk

    print(f"apache-airflow-task-sdk {airflow.sdk.__version__}, API version {API_VERSION}")
    workloads = claim(args.url.rstrip("/"), args.api_key, args.limit)
    if not workloads:
        print("no queued task instance to claim: trigger a run first (see README.md)")
        return 2
    for workload in workloads:
        drive(args.url.rstrip("/"), workload)
    failed = [name for name, ok, _ in CHECKS if not ok]
    print(f"{len(CHECKS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
