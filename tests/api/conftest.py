"""Helpers for the worker API tests: a JSON client that signs requests with a TI's token."""

import json
from typing import Any

import pytest
from django.test import Client

from assets_app.api import auth
from assets_app.models import TaskInstance


def current_try(ti_id: Any) -> int:
    """The TI's try number now (1 for an unknown TI): a token for the try under test."""
    found = TaskInstance.objects.filter(id=ti_id).values_list("try_number", flat=True).first()
    return found or 1


class WorkerClient:
    """Django test client speaking JSON to /execution/, with the token of one TI."""

    def __init__(self) -> None:
        self.client = Client()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ti_id: Any = None,
        token: str | None = None,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
        **params: Any,
    ):
        headers = {"Airflow-API-Version": "2026-06-30"}
        if token is None and ti_id is not None:
            token = auth.issue_token(ti_id, try_number=current_try(ti_id))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        call = getattr(self.client, method.lower())
        if method.upper() == "GET":
            return call(f"/execution{path}", params, headers=headers)
        return call(f"/execution{path}", data=data, content_type=content_type, headers=headers)


@pytest.fixture
def worker_api() -> WorkerClient:
    return WorkerClient()
