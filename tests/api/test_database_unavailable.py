"""Finding 6 of issue 13: a database full or away is a 503 with Retry-After and `detail.reason`,
wherever it surfaces (an API view, a plain view, a middleware loading the session), and other
database errors stay what they were. The proof with a real exhausted PostgreSQL is
tests/proof/test_db_full.py; here the error is raised where the database would raise it."""

import logging

import psycopg
import psycopg.errors
import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import IntegrityError, InterfaceError, OperationalError
from django.test import Client
from psycopg_pool import PoolTimeout

from assets_app.operations import observability
from assets_app.sql.errors import database_unavailable_reason
from assets_app.task_state import claims

pytestmark = pytest.mark.django_db


def wrapped(cause: Exception, cls=OperationalError) -> Exception:
    """What Django raises: its own class, the driver's error as __cause__."""
    error = cls(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (wrapped(PoolTimeout("couldn't get a connection after 3.00 sec")), "database_busy"),
        (wrapped(psycopg.errors.TooManyConnections("sorry, too many clients")), "database_busy"),
        (wrapped(psycopg.OperationalError("connection refused")), "database_unavailable"),
        (wrapped(psycopg.errors.AdminShutdown("terminating connection")), "database_unavailable"),
        (wrapped(psycopg.errors.CannotConnectNow("starting up")), "database_unavailable"),
        (wrapped(psycopg.errors.DiskFull("no space left")), "database_unavailable"),
        (InterfaceError("connection already closed"), "database_unavailable"),
        (wrapped(psycopg.errors.LockNotAvailable("lock timeout")), None),
        (wrapped(psycopg.errors.DeadlockDetected("deadlock")), None),
        (wrapped(psycopg.errors.UniqueViolation("dup"), IntegrityError), None),
        (ValueError("not a database error"), None),
    ],
    ids=lambda x: type(x.__cause__ or x).__name__ if isinstance(x, Exception) else str(x),
)
def test_which_errors_mean_retry_later(error, reason):
    assert database_unavailable_reason(error) == reason


def _raise(error):
    def fail(*args, **kwargs):
        raise error

    return fail


def test_worker_api_answers_503_with_retry_after(monkeypatch, settings):
    settings.DATABASE_RETRY_AFTER_SECONDS = 7
    monkeypatch.setattr(claims, "claim_workloads", _raise(wrapped(PoolTimeout("timeout"))))
    response = Client().post(
        "/execution/workloads/claim",
        data={"hostname": "w", "limit": 1},
        content_type="application/json",
        headers={"Authorization": f"Bearer {settings.WORKER_API_KEY}"},
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "7"
    detail = response.json()["detail"]
    assert detail["reason"] == "database_busy"
    assert detail["retry_after_seconds"] == 7
    assert "retry in 7 s" in detail["message"]


def test_another_database_error_is_still_a_500(monkeypatch, settings):
    error = wrapped(psycopg.errors.UniqueViolation("dup"), IntegrityError)
    monkeypatch.setattr(claims, "claim_workloads", _raise(error))
    response = Client(raise_request_exception=False).post(
        "/execution/workloads/claim",
        data={"hostname": "w", "limit": 1},
        content_type="application/json",
        headers={"Authorization": f"Bearer {settings.WORKER_API_KEY}"},
    )
    assert response.status_code == 500


def test_a_plain_view_answers_503(monkeypatch):
    error = wrapped(psycopg.errors.TooManyConnections("sorry, too many clients already"))
    monkeypatch.setattr(observability, "render_prometheus", _raise(error))
    response = Client().get("/metrics")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["detail"]["reason"] == "database_busy"


def test_a_middleware_loading_the_session_answers_503_without_a_traceback(
    monkeypatch, admin_client, caplog
):
    """The session is read by a middleware, before any view: the 500 handler answers the admin a
    plain 503 page, and the log has one warning line, no traceback."""
    monkeypatch.setattr(
        SessionStore, "load", _raise(wrapped(psycopg.OperationalError("connection refused")))
    )
    admin_client.raise_request_exception = False
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = admin_client.get("/admin/assets_app/dag/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response["Content-Type"].startswith("text/html")
    assert b"Service unavailable" in response.content
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records and all(r.levelno == logging.WARNING and not r.exc_info for r in records)
