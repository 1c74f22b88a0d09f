"""How the proof suites finish task instances: in-process through `task_state` (the code the
worker API calls), or over HTTP exactly as a worker does, retrying what a dead server dropped."""

import time
from datetime import UTC, datetime
from typing import Any

import requests

from assets_app.api.auth import issue_token
from assets_app.task_state import success


def asset_outlets(names: list[str]) -> list[dict[str, str]]:
    return [{"name": name, "uri": name, "type": "Asset"} for name in names]


def succeed_ti(ti: Any, outlets: list[dict[str, str]]) -> Any:
    """running -> success with these outlets, through the domain function."""
    return success.succeed(
        ti_id=ti.id,
        try_number=ti.try_number,
        end_date=datetime.now(UTC),
        task_outlets=[{**o, "type": "Asset"} for o in outlets],
        outlet_events=[],
    )


def success_body(names: list[str], *, end_date: datetime | None = None) -> dict[str, Any]:
    return {
        "state": "success",
        "end_date": (end_date or datetime.now(UTC)).isoformat(),
        "task_outlets": asset_outlets(names),
        "outlet_events": [],
    }


def auth_headers(ti_id: Any, try_number: int = 1) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(ti_id, try_number=try_number)}"}


def patch_state_until_answered(
    base_url: str,
    ti_id: Any,
    body: dict[str, Any],
    *,
    deadline: float,
    session: requests.Session | None = None,
    timeout: float = 30,
) -> tuple[requests.Response, int]:
    """PATCH .../state, retrying the identical request while the server is unreachable or the
    connection drops mid-request (a worker's retry). Returns (response, connection failures)."""
    http = session or requests
    failures = 0
    while True:
        try:
            response = http.patch(
                f"{base_url}/execution/task-instances/{ti_id}/state",
                json=body,
                headers=auth_headers(ti_id),
                timeout=timeout,
            )
            return response, failures
        except requests.ConnectionError:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
