"""Retention (issue 30): what a clean deletes, and every rule that keeps a row.

Each "never deletes" rule has a test here that fails when its exclusion is taken out of
`assets_app/operations/retention.py` (or `locks.lock_runs_for_retention`)."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from assets_app.models import (
    AssetAliasEvent,
    AssetDagRunQueue,
    AssetEvent,
    AssetStateStore,
    AuditEntry,
    AuditTarget,
    ComponentHeartbeat,
    DagCallbackRequest,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    HITLDetail,
    RenderedTaskFields,
    TaskInstance,
    TaskLogChunk,
    TaskReschedule,
    TaskStateStore,
    TIState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    XCom,
)
from assets_app.operations import audit, metrics, observability, retention
from tests.factories import (
    AssetAliasFactory,
    AssetEventFactory,
    AssetEventQueueFactory,
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=400)


@pytest.fixture(autouse=True)
def _policy(settings, tmp_path):
    settings.RETENTION_RUN_DAYS = 90
    settings.RETENTION_KEEP_LAST_RUNS = 1
    settings.RETENTION_XCOM_DAYS = 30
    settings.RETENTION_EVENT_DAYS = 90
    settings.RETENTION_AUDIT_DAYS = 365
    settings.RETENTION_BATCH_SIZE = 2
    settings.RETENTION_SLEEP_RATIO = 0  # unpaced here; the pacing tests set their own
    settings.RETENTION_EXPORT_DIR = ""
    settings.RETENTION_PERIODIC = False


def ago(delta=OLD):
    return timezone.now() - delta


def old_run(dag, *, state=DagRunState.SUCCESS, ti_state=TIState.SUCCESS, age=OLD, tis=1):
    run = DagRunFactory(dag=dag, state=state, run_after=ago(age), end_date=ago(age))
    made = [TaskInstanceFactory(dag_run=run, state=ti_state) for _ in range(tis)]
    for ti in made:
        XCom.objects.create(
            dag_id=dag.dag_id, run_id=run.run_id, task_id=ti.task_id, key="k", timestamp=ago(age)
        )
    return run, made


def old_event(asset=None, age=OLD):
    return AssetEventFactory(asset=asset or AssetFactory(), timestamp=ago(age))


def exists(model, pk):
    return model.objects.filter(pk=pk).exists()


def _callback_request(run, *, state):
    return DagCallbackRequest.objects.create(
        dag_run=run,
        dag_id=run.dag_id,
        clear_number=0,
        is_failure_callback=False,
        reason="success",
        state=state,
    )


def test_a_run_whose_dag_callback_has_not_run_is_kept():
    """Issue 39: a pending (or parked) callback request is work not done."""
    dag = DagFactory()
    waiting, _ = old_run(dag)
    parked, _ = old_run(dag)
    old_run(dag)  # the last run
    _callback_request(waiting, state="pending")
    _callback_request(parked, state="parked")
    retention.clean()
    assert exists(DagRun, waiting.pk)
    assert exists(DagRun, parked.pk)


def test_a_clean_deletes_old_history_with_its_dependent_rows_and_keeps_the_last_run():
    dag = DagFactory()
    gone, gone_tis = old_run(dag, tis=2)
    RenderedTaskFields.objects.create(ti=gone_tis[0], fields={"a": 1})
    now = timezone.now()
    TaskReschedule.objects.create(
        ti=gone_tis[0], try_number=1, start_date=now, end_date=now, reschedule_date=now
    )
    last, _ = old_run(dag)
    event = old_event()
    AssetAliasEvent.objects.create(alias=AssetAliasFactory(), asset_event=event)
    DagRunAssetEvent.objects.create(dag_run=gone, dag=dag, asset_event=event)
    # Issue 39: its Dag callback ran: the request goes with the run.
    _callback_request(gone, state="success")
    entry = audit.record(actor=None, action="x", summary="old")
    AuditEntry.objects.filter(pk=entry.pk).update(at=ago(timedelta(days=800)))

    result = retention.clean()

    assert not exists(DagRun, gone.pk)
    assert not TaskInstance.objects.filter(dag_run_id=gone.pk).exists()
    assert not XCom.objects.filter(run_id=gone.run_id).exists()
    assert not exists(AssetEvent, event.pk)
    assert not exists(AuditEntry, entry.pk)
    assert exists(DagRun, last.pk)  # the last run of the Dag
    assert XCom.objects.filter(run_id=last.run_id).exists()
    assert result.counts == {
        "dag_run": 1,
        "task_instance": 2,
        "rendered_task_fields": 1,
        "task_reschedule": 1,
        "task_log_chunk": 0,
        "hitl_detail": 0,
        "dagrun_asset_event": 1,
        "dag_callback_request": 1,
        "xcom": 2,  # the deleted run's; the kept last run keeps its XComs
        "task_state_store": 0,
        "asset_event": 1,
        "asset_alias_event": 1,
        "audit_entry": 1,
        "audit_target": 0,
    }


def test_dry_run_counts_equal_the_rows_then_deleted_and_a_second_clean_deletes_nothing():
    dag = DagFactory()
    # Kept by a rule the clean checks per batch, after its scan (`run_scan`), dry run too.
    busy, _ = old_run(dag, ti_state=TIState.RUNNING)
    held, held_tis = old_run(dag)
    AssetEventQueueFactory(ti_id=held_tis[0].id)
    runs = [old_run(dag, tis=2)[0] for _ in range(5)]
    events = [old_event() for _ in range(5)]
    # Events consumed only by runs the clean deletes go in the same clean.
    for run, event in zip(runs[:3], events[:3], strict=True):
        DagRunAssetEvent.objects.create(dag_run=run, dag=dag, asset_event=event)
    # ...an event consumed by the kept last run stays.
    DagRunAssetEvent.objects.create(dag_run=runs[-1], dag=dag, asset_event=events[-1])
    for _ in range(3):
        entry = audit.record(actor=None, action="x", summary="old")
        AuditEntry.objects.filter(pk=entry.pk).update(at=ago(timedelta(days=800)))

    dry = retention.clean(dry_run=True)
    assert DagRun.objects.count() == 7  # nothing deleted
    real = retention.clean()
    assert dry.counts == real.counts
    assert real.counts["dag_run"] == 4 and real.counts["asset_event"] == 4
    assert real.total > 0
    again = retention.clean()
    assert again.total == 0
    assert exists(AssetEvent, events[-1].pk)
    assert exists(DagRun, busy.pk) and exists(DagRun, held.pk)


def test_a_batch_commits_without_waiting_for_its_wal_flush_and_only_it(monkeypatch):
    """`sql.retention.commit_without_waiting_for_flush`: each deleting batch's transaction runs
    with synchronous_commit off (SET LOCAL), the connection's own setting is untouched after it,
    and a dry run does not change it."""
    from django.db import connection

    from assets_app.sql import retention as retention_sql

    seen = []
    real_delete = retention_sql.delete_rows

    def recording_delete(queryset):
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            seen.append(cursor.fetchone()[0])
        return real_delete(queryset)

    monkeypatch.setattr(retention_sql, "delete_rows", recording_delete)
    dag = DagFactory()
    old_run(dag)
    old_run(dag)
    old_event()
    retention.clean()
    assert seen and set(seen) == {"off"}
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def _recorded_pauses(monkeypatch) -> list[float]:
    """The seconds each pause of a clean asked to sleep, each checked to fall outside any
    transaction (a pause must hold no lock and no snapshot)."""
    from django.db import connection

    pauses: list[float] = []

    def sleep(seconds):
        assert not connection.in_atomic_block
        pauses.append(seconds)

    monkeypatch.setattr(retention.time, "sleep", sleep)
    return pauses


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_clean_pauses_its_sleep_ratio_times_each_batch_after_it(settings, monkeypatch, dry_run):
    """After each batch, a clean sleeps RETENTION_SLEEP_RATIO times as long as the batch took
    (its transaction's duration, as the progress lines give it), dry runs too."""
    settings.RETENTION_SLEEP_RATIO = 2.5
    pauses = _recorded_pauses(monkeypatch)
    batch_ms: list[float] = []
    dag = DagFactory()
    for _ in range(4):
        old_run(dag)
    for _ in range(3):
        old_event()
    result = retention.clean(dry_run=dry_run, progress=lambda table, rows, ms: batch_ms.append(ms))
    assert result.counts["dag_run"] == 3 and result.counts["asset_event"] == 3
    assert result.batches == len(batch_ms) >= 3
    assert pauses == pytest.approx([2.5 * ms / 1000 for ms in batch_ms])
    assert result.paused_seconds == pytest.approx(sum(pauses))
    assert result.summary()["paused_seconds"] == round(sum(pauses), 1)


def test_a_sleep_ratio_of_zero_never_pauses_and_a_negative_one_is_refused(monkeypatch):
    pauses = _recorded_pauses(monkeypatch)
    dag = DagFactory()
    for _ in range(3):
        old_run(dag)
    with pytest.raises(retention.RetentionError, match="sleep ratio must be 0 or more"):
        retention.clean(sleep_ratio=-1)
    assert DagRun.objects.count() == 3  # refused before any batch
    result = retention.clean(sleep_ratio=0)
    assert result.counts["dag_run"] == 2 and pauses == [] and result.paused_seconds == 0


def test_a_pause_never_runs_past_the_time_budget(monkeypatch):
    """The periodic clean's budget bounds the pauses too: with a ratio far above it, the first
    pause is cut to what is left of the budget (slept for real), and the clean stops there,
    incomplete, with the rest left for the next one."""
    real_sleep = retention.time.sleep
    pauses: list[float] = []

    def sleep(seconds):
        pauses.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(retention.time, "sleep", sleep)
    dag = DagFactory()
    for _ in range(4):
        old_run(dag)
    started = retention.time.monotonic()
    result = retention.clean(sleep_ratio=1_000_000, time_budget_seconds=0.5)
    took = retention.time.monotonic() - started
    assert result.batches == 1 and len(pauses) == 1 and 0 < pauses[0] < 0.5
    assert took < 1.5 and not result.complete
    assert DagRun.objects.count() == 3  # one batch: one run (batch size 2 / RUN_BATCH_DIVISOR)


def test_events_queued_for_a_dag_are_kept():
    dag = DagFactory()
    queued = old_event()
    AssetDagRunQueue.objects.create(target_dag=dag, asset_event=queued, asset=queued.asset)
    plain = old_event()
    retention.clean()
    assert exists(AssetEvent, queued.pk)
    assert not exists(AssetEvent, plain.pk)


def test_events_not_yet_consumed_by_a_paused_dag_scheduled_on_them_are_kept():
    asset = AssetFactory()
    dag = DagFactory(is_paused=True, schedule={"asset": asset.name})
    waiting = old_event(asset)
    AssetDagRunQueue.objects.create(target_dag=dag, asset_event=waiting, asset=asset)
    retention.clean(tables=["asset_event"])
    assert exists(AssetEvent, waiting.pk)
    assert AssetDagRunQueue.objects.filter(asset_event=waiting).exists()


def test_events_consumed_by_a_kept_run_are_kept():
    dag = DagFactory()
    last, _ = old_run(dag)
    event = old_event()
    DagRunAssetEvent.objects.create(dag_run=last, dag=dag, asset_event=event)
    retention.clean()
    assert exists(AssetEvent, event.pk)
    assert DagRunAssetEvent.objects.filter(dag_run=last).exists()


def test_outbox_rows_are_never_deleted_and_keep_the_runs_of_their_task_instances():
    dag = DagFactory()
    run, tis = old_run(dag)
    old_run(dag)  # the last run, kept anyway
    pending = AssetEventQueueFactory(ti_id=tis[0].id, created_at=ago())
    backing_off = AssetEventQueueFactory(attempts=3, next_attempt_at=ago(-timedelta(hours=1)))
    parked = AssetEventQueueFactory(parked=True, created_at=ago())
    retention.clean()
    assert exists(DagRun, run.pk)
    assert exists(TaskInstance, tis[0].pk)
    for row in (pending, backing_off, parked):
        assert type(row).objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize(
    ("run_state", "ti_state"),
    [
        (DagRunState.RUNNING, TIState.SUCCESS),
        (DagRunState.QUEUED, TIState.QUEUED),
        (DagRunState.SUCCESS, TIState.UP_FOR_RETRY),
        (DagRunState.FAILED, TIState.RUNNING),
    ],
)
def test_running_or_queued_work_and_its_runs_are_kept(run_state, ti_state):
    dag = DagFactory()
    busy, tis = old_run(dag, state=run_state, ti_state=ti_state)
    old_run(dag)  # the last run
    retention.clean()
    assert exists(DagRun, busy.pk)
    assert exists(TaskInstance, tis[0].pk)
    assert XCom.objects.filter(run_id=busy.run_id).exists()


def test_the_last_runs_of_every_dag_are_kept(settings):
    settings.RETENTION_KEEP_LAST_RUNS = 3
    dag, other = DagFactory(), DagFactory()
    runs = [old_run(dag)[0] for _ in range(5)]
    only = old_run(other)[0]
    retention.clean()
    assert set(DagRun.objects.filter(dag=dag).values_list("pk", flat=True)) == {
        r.pk for r in runs[-3:]
    }
    assert exists(DagRun, only.pk)


def test_keeping_no_run_is_refused(settings):
    settings.RETENTION_KEEP_LAST_RUNS = 0
    run = old_run(DagFactory())[0]
    with pytest.raises(retention.RetentionError, match="at least 1"):
        retention.clean()
    assert exists(DagRun, run.pk)


def test_rows_a_kept_audit_entry_points_at_are_kept_until_the_entry_goes():
    dag = DagFactory()
    cleared, _ = old_run(dag)
    ti_run, ti_tis = old_run(dag)
    old_run(dag)  # the last run
    event = old_event()
    audit.record(
        actor=None, action="clear", summary="s", targets=[audit.Target("dag_run", cleared.pk)]
    )
    audit.record(
        actor=None,
        action="clear",
        summary="s",
        targets=[audit.Target("task_instance", ti_tis[0].id, ti_id=ti_tis[0].id)],
    )
    audit.record(
        actor=None, action="clear", summary="s", targets=[audit.Target("asset_event", event.pk)]
    )

    retention.clean()
    assert exists(DagRun, cleared.pk)
    assert exists(DagRun, ti_run.pk)
    assert exists(AssetEvent, event.pk)

    # A clean of audit entries alone keeps nothing a remaining entry points at; once the entries
    # are past the audit age, the rows go with them in one clean.
    AuditEntry.objects.update(at=ago(timedelta(days=800)))
    retention.clean(tables=["dag_run", "asset_event"])
    assert exists(DagRun, cleared.pk) and exists(AssetEvent, event.pk)
    retention.clean()
    assert not exists(DagRun, cleared.pk)
    assert not exists(DagRun, ti_run.pk)
    assert not exists(AssetEvent, event.pk)
    assert not AuditTarget.objects.filter(kind="dag_run").exists()


def test_young_rows_are_kept():
    dag = DagFactory()
    young, _ = old_run(dag, age=timedelta(days=10))
    old_run(dag, age=timedelta(days=5))
    event = old_event(age=timedelta(days=10))
    retention.clean()
    assert exists(DagRun, young.pk)
    assert exists(AssetEvent, event.pk)
    assert XCom.objects.filter(run_id=young.run_id).exists()  # 10 days < 30: kept


def test_tables_and_timestamp_narrow_the_clean():
    dag = DagFactory()
    run, _ = old_run(dag)
    old_run(dag)
    event = old_event(age=timedelta(days=20))
    result = retention.clean(tables=["asset_event"], before=timezone.now() - timedelta(days=10))
    assert result.counts == {"asset_event": 1, "asset_alias_event": 0}
    assert exists(DagRun, run.pk)
    assert not exists(AssetEvent, event.pk)
    with pytest.raises(retention.RetentionError, match="unknown table"):
        retention.clean(tables=["log"])


def test_export_writes_every_deleted_row_before_deleting(tmp_path):
    dag = DagFactory()
    run, tis = old_run(dag)
    old_run(dag)
    event = old_event()
    result = retention.clean(export_dir=str(tmp_path))
    exported = {
        path.name.split(".")[0]: [json.loads(line) for line in path.read_text().splitlines()]
        for path in tmp_path.iterdir()
    }
    assert [row["id"] for row in exported["dag_run"]] == [run.pk]
    assert [row["id"] for row in exported["task_instance"]] == [str(tis[0].pk)]
    assert [row["id"] for row in exported["asset_event"]] == [event.pk]
    assert len(result.export_files) == len(exported)


def test_a_clean_is_recorded_for_the_dashboard_and_audited():
    dag = DagFactory()
    old_run(dag)
    old_run(dag)
    retention.clean()
    beat = ComponentHeartbeat.objects.get(component="retention")
    assert beat.last_ok_at is not None and beat.detail["dag_run"] == 1
    assert AuditEntry.objects.filter(action="retention.clean").count() == 1
    last = observability.last_retention_clean()
    assert last.ok and last.detail["deleted"] > 0
    assert metrics.value(metrics.RETENTION_ROWS_DELETED) == last.detail["deleted"]


def test_a_failure_is_loud(monkeypatch):
    dag = DagFactory()
    old_run(dag)
    old_run(dag)

    def broken(queryset):
        raise RuntimeError("disk full")

    monkeypatch.setattr(retention.retention_sql, "delete_rows", broken)
    with pytest.raises(CommandError, match="disk full"):
        call_command("db_clean", "--yes", stdout=io.StringIO())
    assert metrics.value(metrics.RETENTION_FAILURES) == 1
    last = observability.last_retention_clean()
    assert not last.ok and "disk full" in last.warning
    body = observability.render_prometheus()
    assert "asset_service_retention_failures_total 1.0" in body
    assert "asset_service_retention_last_clean_failed 1.0" in body
    assert DagRun.objects.count() == 2  # the failed batch rolled back whole


def test_command_dry_run_and_yes(monkeypatch):
    dag = DagFactory()
    old_run(dag)
    old_run(dag)
    out = io.StringIO()
    call_command("db_clean", "--dry-run", "--verbose", stdout=out, stderr=io.StringIO())
    assert "dry run: would delete" in out.getvalue()
    assert DagRun.objects.count() == 2
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal
    with pytest.raises(CommandError, match="--yes"):
        call_command("db_clean", stdout=io.StringIO())
    assert DagRun.objects.count() == 2
    out = io.StringIO()
    call_command("db_clean", "-y", "--batch-size", "1", "--sleep-ratio", "0", stdout=out)
    assert "deleted" in out.getvalue() and DagRun.objects.count() == 1
    assert "paused 0.0 s" in out.getvalue()
    with pytest.raises(CommandError, match="sleep ratio must be 0 or more"):
        call_command("db_clean", "-y", "--sleep-ratio", "-0.5", stdout=io.StringIO())


def test_periodic_clean_is_off_by_default_and_waits_for_its_interval(settings):
    dag = DagFactory()
    old_run(dag)
    old_run(dag)
    assert retention.periodic_clean() is None
    assert DagRun.objects.count() == 2
    settings.RETENTION_PERIODIC = True
    result = retention.periodic_clean()
    assert result is not None and result.counts["dag_run"] == 1
    old_run(dag)
    assert retention.periodic_clean() is None  # within RETENTION_INTERVAL_MINUTES
    assert DagRun.objects.count() == 2


def test_a_deleted_runs_task_logs_go_with_it():
    """Issue 27's shipped logs fall under retention: a run's TIs are deleted with their log
    chunks (without them PostgreSQL's deferred foreign key refused the batch at its commit)."""
    dag = DagFactory()
    run, (ti,) = old_run(dag)
    kept, (kept_ti,) = old_run(dag)
    for owner in (ti, kept_ti):
        TaskLogChunk.objects.create(ti=owner, try_number=1, offset=0, size=4, content="log\n")
    result = retention.clean()
    assert result.counts["task_log_chunk"] == 1
    assert not exists(DagRun, run.pk) and exists(DagRun, kept.pk)
    assert list(TaskLogChunk.objects.values_list("ti_id", flat=True)) == [kept_ti.id]


def test_a_deleted_runs_hitl_details_go_with_it():
    """Issue 42: a run's Human-in-the-loop details go with its TIs (Airflow's ON DELETE
    CASCADE; without this step PostgreSQL's deferred foreign key refuses the batch)."""
    dag = DagFactory()
    run, (ti,) = old_run(dag)
    kept, (kept_ti,) = old_run(dag)
    for owner in (ti, kept_ti):
        HITLDetail.objects.create(ti=owner, options=["OK"], subject="s")
    result = retention.clean()
    assert result.counts["hitl_detail"] == 1
    assert not exists(DagRun, run.pk) and exists(DagRun, kept.pk)
    assert list(HITLDetail.objects.values_list("ti_id", flat=True)) == [kept_ti.id]


def test_task_state_keys_go_with_their_run_or_once_expired_and_live_ones_stay():
    """Issue 42: a run's task state keys go with it (Airflow's ON DELETE CASCADE; without this
    step PostgreSQL's deferred foreign key refuses the batch at its commit); an expired key goes
    on its own (Airflow's `airflow state-store clean`); a live key of a kept run stays, and so
    does every asset state key."""
    dag = DagFactory()
    gone, (gone_ti,) = old_run(dag)
    kept, (kept_ti,) = old_run(dag)

    def key(ti, name, expires_at=None):
        return TaskStateStore.objects.create(
            dag_run=ti.dag_run, dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
            key=name, value="1", expires_at=expires_at,
        )  # fmt: skip

    key(gone_ti, "never_expires")
    live = key(kept_ti, "never_expires")
    later = key(kept_ti, "expires_later", expires_at=timezone.now() + timedelta(days=1))
    expired = key(kept_ti, "expired", expires_at=ago(timedelta(seconds=1)))
    asset_key = AssetStateStore.objects.create(asset=AssetFactory(), key="watermark", value="1")

    dry = retention.clean(dry_run=True)
    result = retention.clean()

    assert dry.counts["task_state_store"] == result.counts["task_state_store"] == 2
    assert not exists(DagRun, gone.pk) and exists(DagRun, kept.pk)
    assert set(TaskStateStore.objects.values_list("pk", flat=True)) == {live.pk, later.pk}
    assert not exists(TaskStateStore, expired.pk)
    assert exists(AssetStateStore, asset_key.pk)


def test_finished_webhook_messages_go_after_their_days_and_pending_ones_never(settings):
    """Issue 29's messages under retention: delivered and failed ones older than
    RETENTION_WEBHOOK_DAYS go with their attempts; a pending one stays whatever its age."""
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/x", secret="s")

    def message(name, state, age):
        delivery = WebhookDelivery.objects.create(
            message_id=name, endpoint=endpoint, event_type="asset.late", body="{}", state=state
        )
        WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=ago(age))
        WebhookAttempt.objects.create(delivery=delivery, status_code=500)
        return delivery

    message("old_delivered", "delivered", timedelta(days=31))
    message("old_failed", "failed", timedelta(days=40))
    message("old_pending", "pending", timedelta(days=400))
    message("young_delivered", "delivered", timedelta(days=29))
    dry = retention.clean(tables=["webhook_delivery"], dry_run=True)
    assert dry.counts == {"webhook_attempt": 2, "webhook_delivery": 2}
    result = retention.clean(tables=["webhook_delivery"])
    assert result.counts == dry.counts
    assert sorted(WebhookDelivery.objects.values_list("message_id", flat=True)) == [
        "old_pending",
        "young_delivered",
    ]
    assert WebhookAttempt.objects.count() == 2
    settings.RETENTION_WEBHOOK_DAYS = 0
    with pytest.raises(retention.RetentionError, match="RETENTION_WEBHOOK_DAYS"):
        retention.clean(tables=["webhook_delivery"])


def test_runs_of_a_backfill_still_going_are_kept_and_a_completed_ones_links_are_cleared():
    """A pending planned date may reprocess (clear) an existing old run when its turn comes: the
    runs of a backfill not completed are kept. A completed backfill's planned dates lose their
    link to a deleted run (the model's SET_NULL, done by the clean: its deletes are raw), so
    the deferred foreign key does not fail the batch at commit."""
    from assets_app.models import Backfill, BackfillDagRun

    dag = DagFactory()
    planned, _ = old_run(dag)
    done, _ = old_run(dag)
    old_run(dag)  # the last run
    when = ago()
    dates = {
        "logical_date": when,
        "data_interval_start": when,
        "data_interval_end": when,
        "run_after": when,
    }
    going = Backfill.objects.create(dag=dag, from_date=when, to_date=when)
    BackfillDagRun.objects.create(backfill=going, dag_run=planned, sort_ordinal=1, **dates)
    over = Backfill.objects.create(
        dag=DagFactory(), from_date=when, to_date=when, completed_at=timezone.now()
    )
    link = BackfillDagRun.objects.create(
        backfill=over, dag_run=done, sort_ordinal=1, started_at=when, **dates
    )

    dry = retention.clean(dry_run=True)
    result = retention.clean()
    assert exists(DagRun, planned.pk)
    assert not exists(DagRun, done.pk)
    assert result.counts["dag_run"] == 1 == dry.counts["dag_run"]
    link.refresh_from_db()
    assert link.dag_run_id is None and link.started_at is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tables", "nope"], "unknown table"),
        (["--batch-size", "0"], "batch size"),
        (["--sleep-ratio", "-1"], "sleep ratio"),
        (["--clean-before-timestamp", "2999-01-01"], "in the future"),
    ],
)
def test_a_mistyped_option_is_a_usage_error_not_a_failed_clean(args, message, caplog):
    """Issue 38: each of these was recorded as a failed clean (ERROR with a traceback, the
    dashboard's retention warning, the failure metric)."""
    with (
        caplog.at_level("ERROR", logger="assets_app.operations.retention"),
        pytest.raises(CommandError, match=message),
    ):
        call_command("db_clean", "--yes", *args, stdout=io.StringIO())
    assert metrics.value(metrics.RETENTION_FAILURES) == 0
    assert not ComponentHeartbeat.objects.filter(component="retention").exists()
    assert "retention failed" not in caplog.text
