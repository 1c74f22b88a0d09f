"""Manual runs: `runs.trigger_dag`, the `trigger_dag` command and `POST /api/v2/dags/{id}/dagRuns`,
with the public API's authentication (API token or staff session, never anonymous)."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from django.utils.crypto import get_random_string

from assets_app.api.public_auth import create_api_token
from assets_app.guards import exceptions
from assets_app.models import ApiToken, Dag, DagRun, TaskInstance
from assets_app.scheduling import runs
from assets_app.task_state import claims, starting
from tests.factories import AssetEventFactory, DagFactory, DagRunFactory, TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v2/dags/{}/dagRuns"


@pytest.fixture
def dag():
    dag = DagFactory(dag_id="report")
    TaskFactory(dag=dag, task_id="extract", retries=2)
    TaskFactory(dag=dag, task_id="load", retries=0)
    return dag


@pytest.fixture
def staff():
    return get_user_model().objects.create_user(
        "ops", password="pw", is_staff=True, is_superuser=True
    )


@pytest.fixture
def token_key(staff):
    _, key = create_api_token(username="ops", name="test")
    return key


def post(client, dag_id, body=None, **headers):
    return client.post(
        URL.format(dag_id),
        data=json.dumps(body if body is not None else {}),
        content_type="application/json",
        headers=headers,
    )


def assert_manual_run(run, *, dag_id="report", tasks=(("extract", 2), ("load", 0))):
    assert run.dag_id == dag_id
    assert run.run_type == "manual"
    assert run.state == "queued"
    assert run.run_id.startswith("manual__")
    tis = list(TaskInstance.objects.filter(dag_run=run).order_by("task_id"))
    assert [(ti.task_id, ti.max_tries) for ti in tis] == list(tasks)
    for ti in tis:
        assert (ti.state, ti.try_number, ti.dag_id, ti.run_id) == (
            "queued",
            1,
            dag_id,
            run.run_id,
        )


# --- domain function ---------------------------------------------------------------------


def test_trigger_dag_creates_queued_run_and_tis(dag):
    run = runs.trigger_dag(dag_id="report", conf={"x": 1}, triggering_user_name="ops")
    run.refresh_from_db()
    assert run.conf == {"x": 1}
    assert run.triggering_user_name == "ops"
    assert_manual_run(run)


def test_trigger_dag_run_ids_are_unique_within_one_timestamp(dag):
    at = timezone.now()
    first = runs.trigger_dag(dag_id="report", run_after=at)
    second = runs.trigger_dag(dag_id="report", run_after=at)
    assert first.run_id != second.run_id
    assert first.run_id.startswith(f"manual__{at.isoformat()}_")


@pytest.mark.parametrize(
    ("kwargs", "error", "reason"),
    [
        ({"dag_id": "nope"}, exceptions.NotFound, "dag_not_found"),
        ({"dag_id": "report", "conf": [1]}, exceptions.InvalidInput, "invalid_conf"),
        ({"dag_id": "report", "conf": "x"}, exceptions.InvalidInput, "invalid_conf"),
    ],
)
def test_trigger_dag_errors_write_nothing(dag, kwargs, error, reason):
    DagFactory(dag_id="paused", paused=True)
    with pytest.raises(error) as info:
        runs.trigger_dag(**kwargs)
    assert info.value.reason == reason
    assert DagRun.objects.count() == 0
    assert TaskInstance.objects.count() == 0


def test_trigger_dag_duplicate_run_id_is_a_conflict(dag):
    runs.trigger_dag(dag_id="report", run_id="mine")
    with pytest.raises(exceptions.Conflict) as info:
        runs.trigger_dag(dag_id="report", run_id="mine")
    assert info.value.reason == "dag_run_exists"
    assert DagRun.objects.count() == 1
    assert TaskInstance.objects.count() == 2


def test_trigger_dag_ignores_max_active_runs(dag):
    dag.max_active_runs = 1
    dag.save()
    DagRunFactory(dag=dag)
    runs.trigger_dag(dag_id="report")
    assert DagRun.objects.filter(dag=dag, state="queued").count() == 2


def test_create_dag_run_query_count_is_flat(django_assert_num_queries):
    """Tasks and consumed events are bulk-inserted: 1 task and 1 event cost what 50 and 200 cost."""
    small, big = DagFactory(), DagFactory()
    TaskFactory(dag=small)
    TaskFactory.create_batch(50, dag=big)
    one = [AssetEventFactory().pk]
    many = [e.pk for e in AssetEventFactory.create_batch(200)]
    for dag, events in ((small, one), (big, many)):
        # tasks, insert run, event links, TIs (no savepoint: the run_id is generated)
        with django_assert_num_queries(4):
            run = runs.create_dag_run(
                dag=dag,
                run_type="asset_triggered",
                run_after=timezone.now(),
                consumed_event_ids=events,
            )
        assert run.run_id.startswith("asset_triggered__")
        assert sorted(run.consumed_links.values_list("asset_event_id", flat=True)) == sorted(events)
        assert set(run.consumed_links.values_list("dag_id", flat=True)) == {dag.dag_id}
    assert TaskInstance.objects.filter(dag_run__dag=big).count() == 50


def test_create_dag_run_with_an_explicit_run_id_adds_only_the_savepoint(django_assert_num_queries):
    """A given run_id may clash, so its insert runs in a savepoint: 2 more queries, still flat."""
    dag = DagFactory()
    TaskFactory.create_batch(3, dag=dag)
    # tasks, savepoint + insert run + release, TIs (no events)
    with django_assert_num_queries(5):
        run = runs.create_dag_run(
            dag=dag, run_type="manual", run_id="mine", run_after=timezone.now()
        )
    assert run.run_id == "mine"
    assert TaskInstance.objects.filter(dag_run=run).count() == 3


# --- command -----------------------------------------------------------------------------


def test_trigger_dag_command_prints_run_and_tis(dag):
    out = StringIO()
    call_command("trigger_dag", "report", "--conf", '{"a": [1, 2]}', stdout=out)
    run = DagRun.objects.get()
    assert run.conf == {"a": [1, 2]}
    assert_manual_run(run)
    text = out.getvalue()
    assert run.run_id in text
    assert "extract" in text and "load" in text
    for ti in TaskInstance.objects.all():
        assert str(ti.id) in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "dag 'nope' does not exist"),
        (["report", "--conf", "{bad"], "--conf is not valid JSON"),
        (["report", "--conf", "[1]"], "conf must be a JSON object"),
    ],
)
def test_trigger_dag_command_errors(dag, args, message):
    DagFactory(dag_id="paused", paused=True)
    with pytest.raises(CommandError, match=message):
        call_command("trigger_dag", *args, stdout=StringIO())
    assert DagRun.objects.count() == 0


# --- API: authentication -----------------------------------------------------------------


def test_anonymous_gets_401_and_nothing_is_written(dag):
    response = post(Client(), "report")
    assert response.status_code == 401
    assert response.json() == {
        "detail": {"reason": "not_authenticated", "message": "missing or invalid credentials"}
    }
    assert DagRun.objects.count() == 0


@pytest.mark.parametrize(
    "authorization", ["Bearer wrong", "Bearer ", "Basic b3BzOnB3", "Token abc", "Bearer"]
)
def test_bad_token_gets_401(dag, token_key, authorization):
    response = post(Client(), "report", Authorization=authorization)
    assert response.status_code == 401
    assert response.json()["detail"]["reason"] == "not_authenticated"
    assert DagRun.objects.count() == 0


def test_bad_token_is_401_even_with_a_staff_session(dag, staff):
    client = Client()
    client.force_login(staff)
    response = post(client, "report", Authorization="Bearer wrong")
    assert response.status_code == 401


def test_token_of_inactive_user_gets_401(dag, staff, token_key):
    staff.is_active = False
    staff.save()
    response = post(Client(), "report", Authorization=f"Bearer {token_key}")
    assert response.status_code == 401


def test_api_token_triggers_a_run_and_records_last_use(dag, staff, token_key):
    response = post(Client(), "report", {"conf": {"k": "v"}}, Authorization=f"Bearer {token_key}")
    assert response.status_code == 200, response.content
    body = response.json()
    run = DagRun.objects.get()
    assert body["dag_run_id"] == run.run_id
    assert (body["dag_id"], body["run_type"], body["state"]) == ("report", "manual", "queued")
    assert body["conf"] == {"k": "v"}
    assert body["triggering_user_name"] == "ops"
    assert body["logical_date"] is None
    assert_manual_run(run)
    assert ApiToken.objects.get().last_used_at is not None


def test_api_token_last_used_at_is_written_at_most_once_a_minute(dag, token_key):
    client = Client()
    recent = timezone.now() - timedelta(seconds=5)
    ApiToken.objects.update(last_used_at=recent)
    post(client, "nope", Authorization=f"Bearer {token_key}")
    assert ApiToken.objects.get().last_used_at == recent
    stale = timezone.now() - timedelta(minutes=5)
    ApiToken.objects.update(last_used_at=stale)
    post(client, "nope", Authorization=f"Bearer {token_key}")
    assert ApiToken.objects.get().last_used_at > stale


def test_staff_session_with_csrf_token_works(dag, staff):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    # What a browser holds after any Django page set the cookie: a secret, echoed in the header.
    csrf = get_random_string(32)
    client.cookies["csrftoken"] = csrf
    response = post(client, "report", {"conf": {}}, **{"X-CSRFToken": csrf})
    assert response.status_code == 200, response.content
    assert response.json()["triggering_user_name"] == "ops"
    assert_manual_run(DagRun.objects.get())


@pytest.mark.parametrize("header", [None, "wrong" * 8])
def test_staff_session_without_matching_csrf_token_gets_403(dag, staff, header):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    client.cookies["csrftoken"] = get_random_string(32)
    headers = {"X-CSRFToken": header} if header else {}
    response = post(client, "report", **headers)
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "csrf_failed"
    assert DagRun.objects.count() == 0


def test_non_staff_session_gets_403(dag):
    user = get_user_model().objects.create_user("viewer", password="pw")
    client = Client()
    client.force_login(user)
    response = post(client, "report")
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "staff_required"
    assert DagRun.objects.count() == 0


# --- API: trigger endpoint ---------------------------------------------------------------


@pytest.fixture
def api(token_key):
    client = Client(headers={"Authorization": f"Bearer {token_key}"})
    return client


def test_api_unknown_dag_is_404(api):
    response = post(api, "nope")
    assert response.status_code == 404
    assert response.json() == {
        "detail": {"reason": "dag_not_found", "message": "dag 'nope' does not exist"}
    }


def test_api_paused_dag_run_is_taken_and_waits_queued_until_the_unpause(api, dag):
    """Airflow 3.3.2 takes a paused Dag's trigger (`trigger_dag_run` does not look at the
    pause) and its scheduler starts no queued run of a paused Dag
    (`DagRun.get_queued_dag_runs_to_set_running`): the run waits, queued, and its TIs are
    claimed once the Dag is unpaused; another Dag's run is claimed meanwhile."""
    held = DagFactory(dag_id="held", paused=True)
    TaskFactory(dag=held, task_id="root")
    TaskFactory(dag=held, task_id="down").upstream.add(held.tasks.get(task_id="root"))
    response = post(api, "held", {"conf": {"x": 1}})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "queued"
    run = DagRun.objects.get(dag_id="held")
    assert dict(run.task_instances.values_list("task_id", "state")) == {
        "root": "queued",
        "down": "scheduled",
    }
    runs.trigger_dag(dag_id="report")
    claimed = claims.claim_workloads(hostname="w", limit=10)
    assert sorted(w.ti.dag_id for w in claimed) == ["report", "report"]
    assert claims.claim_workloads(hostname="w", limit=10) == []
    run.refresh_from_db()
    assert run.state == "queued"
    unpaused = api.patch(
        "/api/v2/dags/held", data=json.dumps({"is_paused": False}), content_type="application/json"
    )
    assert unpaused.status_code == 200, unpaused.content
    claimed = claims.claim_workloads(hostname="w", limit=10)
    assert [(w.ti.dag_id, w.ti.task_id) for w in claimed] == [("held", "root")]


def test_pausing_holds_a_running_runs_unclaimed_tis_and_lets_a_claimed_one_start(dag):
    """Airflow queues no TI of a paused Dag (`_executable_task_instances_to_queued`:
    `~DM.is_paused`), and a TI already queued to its executor runs: here a TI claimed before
    the pause starts, the others wait for the unpause."""
    run = runs.trigger_dag(dag_id="report")
    (first,) = claims.claim_workloads(hostname="w", limit=1)
    Dag.objects.filter(dag_id="report").update(is_paused=True)
    assert claims.claim_workloads(hostname="w", limit=10) == []
    starting.start(
        ti_id=first.ti.id,
        try_number=1,
        hostname="w",
        unixname="u",
        pid=1,
        start_date=timezone.now(),
    )
    run.refresh_from_db()
    assert run.state == "running"
    assert claims.claim_workloads(hostname="w", limit=10) == []
    Dag.objects.filter(dag_id="report").update(is_paused=False)
    assert len(claims.claim_workloads(hostname="w", limit=10)) == 1


def test_a_cleared_run_of_a_paused_dag_waits_queued(dag):
    """Airflow clears a paused Dag's run (queued again) and starts it on the unpause."""
    run = runs.trigger_dag(dag_id="report")
    TaskInstance.objects.filter(dag_run=run).update(state="success")
    DagRun.objects.filter(pk=run.pk).update(state="success")
    Dag.objects.filter(dag_id="report").update(is_paused=True)
    cleared = runs.clear_dag_run(dag_id="report", run_id=run.run_id, dry_run=False)
    assert cleared.run.state == "queued" and len(cleared.task_instances) == 2
    assert claims.claim_workloads(hostname="w", limit=10) == []
    Dag.objects.filter(dag_id="report").update(is_paused=False)
    assert len(claims.claim_workloads(hostname="w", limit=10)) == 2


def test_api_explicit_run_id_and_duplicate(api, dag):
    body = {
        "dag_run_id": "nightly-1",
        "logical_date": "2026-01-02T03:04:05Z",
        "data_interval_start": "2026-01-01T00:00:00Z",
        "data_interval_end": "2026-01-02T00:00:00Z",
        "note": "by hand",
    }
    response = post(api, "report", body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["dag_run_id"] == "nightly-1"
    assert data["logical_date"].startswith("2026-01-02T03:04:05")
    assert data["note"] == "by hand"
    again = post(api, "report", body)
    assert again.status_code == 409
    assert again.json()["detail"]["reason"] == "dag_run_exists"
    assert DagRun.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"conf": [1, 2]},
        {"conf": "x"},
        {"unknown": 1},
        {"dag_run_id": ""},
        {"logical_date": "2026-01-02T03:04:05"},  # naive datetime
        {"data_interval_start": "2026-01-01T00:00:00Z"},  # without its end
    ],
)
def test_api_invalid_body_is_422_and_writes_nothing(api, dag, body):
    """Airflow's HTTPValidationError: a list of {type, loc, msg}, each naming the body."""
    response = post(api, "report", body)
    assert response.status_code == 422, response.content
    items = response.json()["detail"]
    assert items and all(item["loc"][0] == "body" and item["msg"] for item in items)
    assert DagRun.objects.count() == 0


def test_api_malformed_json_is_400(api, dag):
    response = api.post(URL.format("report"), data="{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"]["reason"] == "invalid_json"
    assert DagRun.objects.count() == 0


# --- create_api_token command ------------------------------------------------------------


def test_create_api_token_command_prints_a_working_key(dag, staff):
    out = StringIO()
    call_command("create_api_token", "ops", "--name", "ci", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    token = ApiToken.objects.get()
    assert token.name == "ci"
    assert token.key_hash == ApiToken.hash_key(key)
    assert key not in token.key_hash
    response = post(Client(), "report", Authorization=f"Bearer {key}")
    assert response.status_code == 200


def test_create_api_token_command_unknown_user():
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_api_token", "ghost", stdout=StringIO())
    assert ApiToken.objects.count() == 0
