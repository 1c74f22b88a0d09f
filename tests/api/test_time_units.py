"""Every lease, timeout and limit in its unit (issue 50): each is checked with its default value
and a controlled clock (a `now=` passed in, or rows written with past timestamps), never a
sleep: the lease or due time a claim or a state change writes is exactly N seconds after the
moment it ran (between the clock read before and after the call), and a timer finds a row due
at N seconds and not one second before. A lease computed in minutes or milliseconds, or a
timeout compared the wrong way, fails here.

Covered elsewhere in the same way: the webhook claim lease (`tests/test_webhooks.py`: twice the
timeout and a second), the outbox and webhook backoffs and caps (`tests/test_drain.py`,
`tests/test_webhooks.py`), the task retry backoff's 24 h cap
(`tests/api/test_execution_dependencies.py`).
"""

import datetime
from datetime import timedelta

import jwt
import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from assets_app.api import auth
from assets_app.models import DagCallbackRequest, DagRun, TaskInstance, TIState, Trigger
from assets_app.runtime import scopes
from assets_app.scheduling import runs, timeouts
from assets_app.task_state import dag_callbacks, liveness
from tests.factories import TaskInstanceFactory
from tests.test_dag_callbacks import _requests
from tests.test_run_timeouts import start
from tests.test_run_timeouts import sync as sync_timed_dag

from .test_execution_claim import claim as claim_workloads
from .test_execution_deferral import DEFERRED, KEY, patch_state
from .test_execution_deferral import claim as claim_triggers

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


@pytest.fixture(autouse=True)
def _api_key(settings):
    settings.WORKER_API_KEY = KEY


class Clock:
    """The server's clock read around a call: what it wrote `n` seconds after the call's
    `now` lies in [before + n, after + n]."""

    def __enter__(self):
        self.before = timezone.now()
        return self

    def __exit__(self, *exc):
        self.after = timezone.now()

    def assert_after(self, moment: datetime.datetime, seconds: float) -> None:
        n = timedelta(seconds=seconds)
        assert self.before + n <= moment <= self.after + n, (moment, self.before, seconds)


def test_the_defaults_are_the_documented_ones():
    """The values the tests below hold the code to (README "Configuration")."""
    assert django_settings.TRIGGER_LEASE_SECONDS == 30
    assert django_settings.DAG_CALLBACK_LEASE_SECONDS == 300
    assert django_settings.WORKLOAD_CLAIM_TIMEOUT_SECONDS == 300
    assert django_settings.TASK_HEARTBEAT_TIMEOUT_SECONDS == 300
    assert django_settings.TASK_SUCCESS_OVERTIME_SECONDS == 20
    assert django_settings.WORKER_TOKEN_LIFETIME_SECONDS == 3600


def test_a_trigger_lease_is_trigger_lease_seconds_and_ends_then(worker_api):
    ti = TaskInstanceFactory(running=True)
    assert patch_state(worker_api, ti, DEFERRED).status_code == 204
    with Clock() as clock:
        claimed = claim_triggers(worker_api, triggerer="t1")
    assert claimed["lease_seconds"] == 30.0
    (trigger,) = Trigger.objects.all()
    clock.assert_after(trigger.lease_until, 30)
    # One second before it ends, another triggerer gets nothing; at its end, the trigger.
    Trigger.objects.update(lease_until=timezone.now() + SECOND)
    assert claim_triggers(worker_api, triggerer="t2")["triggers"] == []
    Trigger.objects.update(lease_until=timezone.now())
    assert [t["id"] for t in claim_triggers(worker_api, triggerer="t2")["triggers"]] == [trigger.id]


def test_a_dag_callback_lease_is_dag_callback_lease_seconds():
    (pk,) = _requests(1)
    with Clock() as clock:
        assert len(dag_callbacks.claim(claimed_by="w1", limit=1)) == 1
    clock.assert_after(DagCallbackRequest.objects.get(id=pk).lease_until, 300)
    DagCallbackRequest.objects.filter(id=pk).update(lease_until=timezone.now() + SECOND)
    assert dag_callbacks.claim(claimed_by="w2", limit=1) == []
    DagCallbackRequest.objects.filter(id=pk).update(lease_until=timezone.now())
    (again,) = dag_callbacks.claim(claimed_by="w2", limit=1)
    assert (again.request.id, again.attempt) == (pk, 2)


def test_a_claimed_workload_is_claimable_again_after_the_claim_timeout_not_before(worker_api):
    ti = TaskInstanceFactory()
    assert (
        len(claim_workloads(worker_api, {"hostname": "a", "limit": 1}, KEY).json()["workloads"])
        == 1
    )
    claimed_at = TaskInstance.objects.get(id=ti.id).claimed_at
    TaskInstance.objects.filter(id=ti.id).update(claimed_at=claimed_at - timedelta(seconds=299))
    assert claim_workloads(worker_api, {"hostname": "b", "limit": 1}, KEY).json()["workloads"] == []
    TaskInstance.objects.filter(id=ti.id).update(claimed_at=claimed_at - timedelta(seconds=301))
    (again,) = claim_workloads(worker_api, {"hostname": "b", "limit": 1}, KEY).json()["workloads"]
    assert again["ti"]["id"] == str(ti.id)


def test_a_running_ti_is_dead_after_the_heartbeat_timeout_not_before():
    ti = TaskInstanceFactory(running=True, max_tries=0)
    now = timezone.now()
    TaskInstance.objects.filter(id=ti.id).update(last_heartbeat_at=now - timedelta(seconds=298))
    assert liveness.fail_dead_task_instances().failed == ()
    assert TaskInstance.objects.get(id=ti.id).state == TIState.RUNNING
    TaskInstance.objects.filter(id=ti.id).update(last_heartbeat_at=now - timedelta(seconds=301))
    assert [str(i) for i in liveness.fail_dead_task_instances().failed] == [str(ti.id)]
    assert TaskInstance.objects.get(id=ti.id).state == TIState.FAILED


def test_a_run_times_out_at_start_plus_its_dagrun_timeout_not_before():
    sync_timed_dag(90)
    run = runs.trigger_dag(dag_id="d")
    start(run, "a")
    run.refresh_from_db()
    assert run.timeout_at == run.start_date + timedelta(seconds=90)
    early = timeouts.time_out_due_runs(now=run.timeout_at - timedelta(microseconds=1))
    assert early.runs == ()
    due = timeouts.time_out_due_runs(now=run.timeout_at)
    assert [r[0] for r in due.runs] == [run.id]
    assert DagRun.objects.get(id=run.id).state == "failed"


def test_a_retry_is_due_after_its_delay_in_seconds(worker_api):
    ti = TaskInstanceFactory(running=True, max_tries=2)
    body = {"state": "up_for_retry", "end_date": "2026-06-30T10:05:00+00:00"}
    with Clock() as clock:
        done = patch_state(worker_api, ti, {**body, "retry_delay_seconds": 90})
    assert done.status_code == 204, done.content
    clock.assert_after(TaskInstance.objects.get(id=ti.id).retry_at, 90)


def test_the_overtime_after_a_finish_is_task_success_overtime_seconds():
    ti = TaskInstanceFactory(running=True)
    TaskInstance.objects.filter(id=ti.id).update(state=TIState.SUCCESS)
    token_ti = scopes.load(ti_id=ti.id)
    finished = token_ti.updated_at
    scopes.check_rendered_fields_write(
        token_ti, token_try=ti.try_number, now=finished + 20 * SECOND
    )
    with pytest.raises(Exception) as refused:
        scopes.check_rendered_fields_write(
            token_ti, token_try=ti.try_number, now=finished + 21 * SECOND
        )
    assert refused.value.reason == "task_not_running"


def test_a_worker_token_lives_worker_token_lifetime_seconds():
    claims = jwt.decode(
        auth.issue_token(TaskInstanceFactory().id, try_number=1),
        options={"verify_signature": False},
    )
    assert claims["exp"] - claims["iat"] == 3600
