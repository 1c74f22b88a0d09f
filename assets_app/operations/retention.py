"""Retention (issue 30): the one writer that deletes history.

Every other writer appends to or updates the history tables (DESIGN: one writer per table);
retention alone deletes from them, by the policy in settings (`Policy.from_settings`, read at
each call), in small batches in key order, each batch one short transaction, and never what is
still needed (`docs/retention.md` says who may delete what):

- asset events queued for a Dag (an ADRQ row: not yet consumed by a Dag scheduled on them, a
  paused one too), consumed by a run that is kept, or named by a kept audit entry;
- outbox rows, whatever their state (pending, backing off, parked): never selected, and the runs
  of their task instances are kept;
- runs that are queued or running, or have a task instance that is not finished;
- the last `RETENTION_KEEP_LAST_RUNS` runs of every Dag (at least one: the last run);
- runs, task instances and events a kept audit entry points at (`AuditTarget`: kind "dag_run" /
  "asset_event" by id, any kind by `ti_id`);
- runs planned by a backfill that is not completed (a pending date may reprocess its run).

A run is deleted with its task instances, their rendered fields, reschedules and shipped log
chunks, its consumed-event links, its XComs and its task state keys (Airflow's task state store
rows go with their run); an expired task state key (`expires_at` passed: the worker resolved
its `retention`, Airflow's `airflow state-store clean`) goes on its own, and a live one (no
`expires_at`, or a future one) only with its run. Asset state keys are not history: they go
with their asset or when a task or an operator deletes them. An event with its alias links; an
audit entry with its targets. Deletes are single statements by key list
(`sql.retention.delete_rows`), children first.

A Dag deleted through the public API (`delete_dag`, `DELETE /api/v2/dags/{dag_id}`) is the
deleter's second caller: the same run batches (`_run_rows`), then the Dag's own rows.

A clean paces itself: after each batch it sleeps `RETENTION_SLEEP_RATIO` (3) times as long as
the batch took, so that it works at most a quarter of the time and a busy database (slower
batches) gets longer pauses. While it works, a clean keeps about a core busy (its process and
its backend in turn) and each success that commits meanwhile flushes the clean's WAL with its
own; paced, a quarter as many successes meet it (bench/retention.py --breakdown at --scale 0.1:
the success p99 during the clean 1.56 x alone unpaced, 1.11 x paced).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import CharField, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from ..guards import exceptions
from ..models import (
    AssetAliasEvent,
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    AuditEntry,
    AuditTarget,
    Backfill,
    BackfillDagRun,
    CallbackState,
    ComponentHeartbeat,
    Dag,
    DagCallbackRequest,
    DagCode,
    DagFavorite,
    DagImportError,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    DeliveryState,
    HITLDetail,
    RenderedTaskFields,
    Task,
    TaskInstance,
    TaskLogChunk,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskReschedule,
    TaskSetupLink,
    TaskStateStore,
    TaskUpstream,
    TIState,
    WatcherRoute,
    WebhookAttempt,
    WebhookDelivery,
    XCom,
)
from ..models.runs import TI_UNFINISHED_STATES
from ..sql import locks
from ..sql import retention as retention_sql
from . import audit, heartbeats, metrics

logger = logging.getLogger(__name__)

COMPONENT = "retention"
# What `--tables` names, in the order a clean goes through them (runs before events: an event
# consumed only by deleted runs is deletable in the same clean).
TABLES = ("dag_run", "xcom", "task_state_store", "asset_event", "audit_entry", "webhook_delivery")
FINISHED_RUN_STATES = (DagRunState.SUCCESS, DagRunState.FAILED)
# A run is deleted with its task instances, links and XComs (five or more rows): a run batch
# holds batch_size / RUN_BATCH_DIVISOR runs, so that its transaction is as short as the others
# (bench/retention.py: 500 runs per batch took 0.8-1.3 s at the median on a loaded machine).
RUN_BATCH_DIVISOR = 5
# Every table a clean deletes from (tests/test_retention_indexes.py: each foreign key into one
# of them is indexed on its referencing column).
DELETED_MODELS = (
    DagRun,
    TaskInstance,
    RenderedTaskFields,
    TaskReschedule,
    TaskLogChunk,
    HITLDetail,
    DagCallbackRequest,
    DagRunAssetEvent,
    XCom,
    TaskStateStore,
    AssetEvent,
    AssetAliasEvent,
    AuditEntry,
    AuditTarget,
    WebhookAttempt,
    WebhookDelivery,
)
# The keys of `CleanResult.summary()` (and so of the retention heartbeat's detail) that are not
# per-table counts; a failed clean's detail has "error" instead.
SUMMARY_FIELDS = ("deleted", "batches", "longest_transaction_ms", "paused_seconds", "complete")
# Webhook messages whose delivery is over (delivered, or failed after its retries): a pending
# one is never deleted, however old.
FINISHED_DELIVERY_STATES = (DeliveryState.DELIVERED, DeliveryState.FAILED)


class RetentionError(Exception):
    """A clean that could not finish: bad settings or arguments, or a failed batch."""


class InvalidOptions(RetentionError):
    """A clean asked for with options it cannot take (an unknown table, a batch size of 0, a
    future cutoff...): a usage error, refused before anything runs and not recorded as a failed
    clean (issue 38: no ERROR, no failed heartbeat, the next periodic clean not delayed)."""


@dataclass(frozen=True)
class Policy:
    """Ages to keep (days) per kind of row, and the runs always kept per Dag."""

    run_days: float
    keep_last_runs: int
    xcom_days: float
    event_days: float
    audit_days: float
    webhook_days: float = 30.0

    @classmethod
    def from_settings(cls) -> Policy:
        policy = cls(
            run_days=float(settings.RETENTION_RUN_DAYS),
            keep_last_runs=int(settings.RETENTION_KEEP_LAST_RUNS),
            xcom_days=float(settings.RETENTION_XCOM_DAYS),
            event_days=float(settings.RETENTION_EVENT_DAYS),
            audit_days=float(settings.RETENTION_AUDIT_DAYS),
            webhook_days=float(settings.RETENTION_WEBHOOK_DAYS),
        )
        policy.check()
        return policy

    def check(self) -> None:
        for name in ("run_days", "xcom_days", "event_days", "audit_days", "webhook_days"):
            if not getattr(self, name) > 0:
                raise RetentionError(
                    f"RETENTION_{name.upper()} must be above 0 (got {getattr(self, name)})"
                )
        if self.keep_last_runs < 1:
            raise RetentionError(
                "RETENTION_KEEP_LAST_RUNS must be at least 1: the last run of a Dag is always "
                f"kept (got {self.keep_last_runs})"
            )

    def cutoffs(self, *, now: datetime, before: datetime | None = None) -> dict[str, datetime]:
        """Rows older than these are candidates, per table; `before` (the command's
        `--clean-before-timestamp`) replaces every age."""
        if before is not None:
            return dict.fromkeys(TABLES, before)
        return {
            "dag_run": now - timedelta(days=self.run_days),
            "xcom": now - timedelta(days=self.xcom_days),
            # Expiry is the row's own (`expires_at`): a key is a candidate once it has passed.
            "task_state_store": now,
            "asset_event": now - timedelta(days=self.event_days),
            "audit_entry": now - timedelta(days=self.audit_days),
            "webhook_delivery": now - timedelta(days=self.webhook_days),
        }


@dataclass
class CleanResult:
    """What one clean did (or, dry, would do): rows per table, including dependent rows."""

    dry_run: bool
    tables: tuple[str, ...]
    cutoffs: dict[str, datetime]
    counts: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    # Every batch transaction's duration (ms): the longest is what the service noticed.
    longest_transaction_ms: float = 0.0
    complete: bool = True  # False: the time budget ran out; the next clean goes on
    export_files: list[str] = field(default_factory=list)
    # Time spent pausing between batches (the sleep ratio's share of the clean).
    paused_seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, table: str, n: int) -> None:
        self.counts[table] = self.counts.get(table, 0) + n

    def summary(self) -> dict[str, Any]:
        return {
            "deleted": self.total,
            **{table: n for table, n in sorted(self.counts.items()) if n},
            "batches": self.batches,
            "longest_transaction_ms": round(self.longest_transaction_ms, 1),
            "paused_seconds": round(self.paused_seconds, 1),
            "complete": self.complete,
        }


# A progress callback: (table, rows of that table so far, the batch's duration in ms).
Progress = Callable[[str, int, float], None]


class _Exporter:
    """JSON Lines of every row about to be deleted, one file per table, flushed to disk before
    the batch's deletes run."""

    def __init__(self, directory: str, stamp: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stamp = stamp
        self.files: dict[str, Any] = {}

    def write(self, table: str, queryset: QuerySet) -> None:
        handle = self.files.get(table)
        if handle is None:
            path = self.directory / f"{table}.{self.stamp}.jsonl"
            handle = self.files[table] = path.open("a", encoding="utf-8")
        for row in queryset.values().iterator():
            handle.write(json.dumps(row, cls=DjangoJSONEncoder, sort_keys=True) + "\n")

    def sync(self) -> None:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())

    def close(self) -> list[str]:
        for handle in self.files.values():
            handle.close()
        return [handle.name for handle in self.files.values()]


def _kept_audit_targets(audit_from: datetime | None) -> QuerySet:
    """Audit targets whose entry this clean keeps: every one when audit entries are not being
    cleaned, else those of entries at or after the audit cutoff."""
    targets = AuditTarget.objects.all()
    return targets if audit_from is None else targets.filter(entry__at__gte=audit_from)


def _last_runs_floor(keep: int, dag_ref: Any) -> Coalesce:
    """The id of a Dag's `keep`-th newest run (0 when it has fewer): runs at or above it are
    kept. One probe of the (dag_id, id) index per row.

    The Dag is a one-value range (`>=` and `<=`) ordered by (dag_id, id), an order only the
    (dag_id, id) index gives: with `dag_id = ...` PostgreSQL drops the constant from the order
    and may walk the primary key backwards instead, filtering out every newer run of every
    other Dag for each candidate (bench/retention.py at --scale 0.05 with the bench's 2,020
    running runs on top: 2,486 rows per probe, 46 ms per select of 100 runs; 0.014 ms per probe
    this way)."""
    nth = (
        DagRun.objects.filter(dag_id__gte=dag_ref, dag_id__lte=dag_ref)
        .order_by("-dag_id", "-id")
        .values("id")[keep - 1 : keep]
    )
    return Coalesce(Subquery(nth, output_field=IntegerField()), 0)


def run_scan(*, cutoff: datetime, keep: int) -> QuerySet:
    """The first, cheap cut of `run_candidates`: finished before `cutoff` and not among their
    Dag's last `keep`, read from the run row and the (dag_id, id) index alone. A clean walks
    this in id order and applies the rest of `run_candidates` to each batch's ids only: as
    NOT EXISTS over the whole scan, PostgreSQL may plan them as anti-joins that read every task
    instance (a merge anti join over the TI index: 76,000 rows at --scale 0.05, 2,000,000 at
    full size) to return 100 runs."""
    return (
        DagRun.objects.filter(state__in=FINISHED_RUN_STATES, run_after__lt=cutoff)
        .filter(Q(end_date__isnull=True) | Q(end_date__lt=cutoff))
        .filter(id__lt=_last_runs_floor(keep, OuterRef("dag_id")))
    )


def run_candidates(*, cutoff: datetime, keep: int, audit_from: datetime | None) -> QuerySet:
    """Runs retention may delete: finished before `cutoff`, not among their Dag's last `keep`,
    every task instance finished, no outbox row of theirs, no Dag callback request not run yet,
    nothing a kept audit entry points at."""
    kept_targets = _kept_audit_targets(audit_from)
    tis = TaskInstance.objects.filter(dag_run=OuterRef("pk"))
    return (
        run_scan(cutoff=cutoff, keep=keep)
        .exclude(Exists(tis.filter(state__in=TI_UNFINISHED_STATES)))
        .exclude(Exists(tis.filter(Exists(AssetEventQueue.objects.filter(ti_id=OuterRef("id"))))))
        # A Dag callback request not run yet (pending or parked) is work not done (issue 39).
        .exclude(
            Exists(
                DagCallbackRequest.objects.filter(
                    dag_run=OuterRef("pk"),
                    state__in=(CallbackState.PENDING, CallbackState.PARKED),
                )
            )
        )
        .exclude(
            Exists(kept_targets.filter(kind="dag_run", object_id=Cast(OuterRef("pk"), CharField())))
        )
        .exclude(Exists(tis.filter(Exists(kept_targets.filter(ti_id=OuterRef("id"))))))
        # A backfill still going may clear (reprocess) a run it planned when that date's turn
        # comes.
        .exclude(
            Exists(
                BackfillDagRun.objects.filter(
                    dag_run=OuterRef("pk"), backfill__completed_at__isnull=True
                )
            )
        )
    )


def xcom_candidates(*, cutoff: datetime, keep: int) -> QuerySet:
    """XComs older than `cutoff` whose run is gone or would be deletable by state and rank: a
    run not finished, with unfinished work, or among its Dag's last `keep` keeps its XComs."""
    kept_runs = DagRun.objects.filter(dag_id=OuterRef("dag_id"), run_id=OuterRef("run_id")).filter(
        ~Q(state__in=FINISHED_RUN_STATES)
        | Q(id__gte=_last_runs_floor(keep, OuterRef("dag_id")))
        | Q(
            Exists(
                TaskInstance.objects.filter(dag_run=OuterRef("pk"), state__in=TI_UNFINISHED_STATES)
            )
        )
    )
    return XCom.objects.filter(timestamp__lt=cutoff).exclude(Exists(kept_runs))


def event_candidates(*, cutoff: datetime, audit_from: datetime | None, linked_ok: bool) -> QuerySet:
    """Events older than `cutoff`, queued for no Dag, named by no kept audit entry, and (unless
    `linked_ok`: a dry run, which filters consumed links itself) consumed by no run."""
    events = (
        AssetEvent.objects.filter(timestamp__lt=cutoff)
        .exclude(Exists(AssetDagRunQueue.objects.filter(asset_event=OuterRef("pk"))))
        .exclude(
            Exists(
                _kept_audit_targets(audit_from).filter(
                    kind="asset_event", object_id=Cast(OuterRef("pk"), CharField())
                )
            )
        )
    )
    if not linked_ok:
        events = events.exclude(Exists(DagRunAssetEvent.objects.filter(asset_event=OuterRef("pk"))))
    return events


def audit_candidates(*, cutoff: datetime) -> QuerySet:
    return AuditEntry.objects.filter(at__lt=cutoff)


def _time_keyset(queryset: QuerySet, column: str, after: tuple[Any, int] | None) -> QuerySet:
    """The next rows in (column, id) order: the age column's index is the key."""
    if after is not None:
        at, pk = after
        # The plain lower bound makes it an index range from the last key on: the OR alone
        # is a filter, and each batch would walk again the index entries of the rows deleted.
        queryset = queryset.filter(**{f"{column}__gte": at}).filter(
            Q(**{f"{column}__gt": at}) | Q(**{column: at, "id__gt": pk})
        )
    return queryset.order_by(column, "id")


def _run_rows(
    runs: list[int], ti_ids: list[Any], pairs: list[tuple[str, str]]
) -> list[tuple[str, QuerySet]]:
    """The rows that go with `runs` (their `(dag_id, run_id)` `pairs`) and their TIs `ti_ids`,
    children first: what a clean's run batch and a Dag deletion's run batch delete."""
    xcoms = XCom.objects.none()
    for dag_id in {d for d, _ in pairs}:
        xcoms = xcoms | XCom.objects.filter(
            dag_id=dag_id, run_id__in=[r for d, r in pairs if d == dag_id]
        )
    return [
        ("rendered_task_fields", RenderedTaskFields.objects.filter(ti_id__in=ti_ids)),
        ("task_reschedule", TaskReschedule.objects.filter(ti_id__in=ti_ids)),
        ("task_log_chunk", TaskLogChunk.objects.filter(ti_id__in=ti_ids)),
        ("hitl_detail", HITLDetail.objects.filter(ti_id__in=ti_ids)),
        ("task_instance", TaskInstance.objects.filter(id__in=ti_ids)),
        ("dagrun_asset_event", DagRunAssetEvent.objects.filter(dag_run_id__in=runs)),
        ("dag_callback_request", DagCallbackRequest.objects.filter(dag_run_id__in=runs)),
        ("xcom", xcoms),
        ("task_state_store", TaskStateStore.objects.filter(dag_run_id__in=runs)),
        ("dag_run", DagRun.objects.filter(id__in=runs)),
    ]


class _Clean:
    def __init__(
        self,
        *,
        policy: Policy,
        tables: tuple[str, ...],
        now: datetime,
        before: datetime | None,
        dry_run: bool,
        batch_size: int,
        sleep_ratio: float,
        deadline: float | None,
        export_dir: str,
        progress: Progress | None,
    ) -> None:
        self.policy = policy
        self.cutoffs = policy.cutoffs(now=now, before=before)
        self.audit_from = self.cutoffs["audit_entry"] if "audit_entry" in tables else None
        self.dry_run = dry_run
        self.batch_size = batch_size
        self.sleep_ratio = sleep_ratio
        self.deadline = deadline
        self.progress = progress
        self.result = CleanResult(
            dry_run=dry_run, tables=tables, cutoffs={t: self.cutoffs[t] for t in tables}
        )
        self.exporter = (
            _Exporter(export_dir, now.strftime("%Y%m%dT%H%M%SZ"))
            if export_dir and not dry_run
            else None
        )
        # Dry run: the runs that would be deleted, so that their consumed links (still there)
        # do not keep the events only they consumed.
        self.assumed_deleted_runs: set[int] = set()
        # ... and their XComs, counted with the runs, not again by the XCom step.
        self.assumed_deleted_pairs: set[tuple[str, str]] = set()

    def out_of_time(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.result.complete = False
            return True
        return False

    def run(self) -> CleanResult:
        try:
            for table in TABLES:
                if table in self.result.tables and not self.out_of_time():
                    getattr(self, f"_clean_{table}")()
        finally:
            if self.exporter is not None:
                self.result.export_files = self.exporter.close()
        return self.result

    def _batch(self, table: str, steps: Callable[[], list[tuple[str, QuerySet]]]) -> None:
        """One short transaction: `steps` (children first) exported, then deleted (or counted)."""
        started = time.monotonic()
        with transaction.atomic(durable=True):
            if not self.dry_run:
                retention_sql.commit_without_waiting_for_flush()
            planned = steps()
            if self.exporter is not None:
                for name, queryset in planned:
                    self.exporter.write(name, queryset)
                self.exporter.sync()
            for name, queryset in planned:
                self.result.add(
                    name, queryset.count() if self.dry_run else retention_sql.delete_rows(queryset)
                )
        elapsed = (time.monotonic() - started) * 1000
        self.result.batches += 1
        self.result.longest_transaction_ms = max(self.result.longest_transaction_ms, elapsed)
        if self.progress is not None:
            self.progress(table, self.result.counts.get(table, 0), elapsed)
        self._pause(elapsed / 1000)

    def _pause(self, worked: float) -> None:
        """Sleep `sleep_ratio` times the batch's `worked` seconds (never past the deadline),
        outside any transaction."""
        pause = worked * self.sleep_ratio
        if self.deadline is not None:
            pause = min(pause, self.deadline - time.monotonic())
        if pause > 0:
            time.sleep(pause)
            self.result.paused_seconds += pause

    # --- runs -------------------------------------------------------------------------------

    def _clean_dag_run(self) -> None:
        cutoff, keep = self.cutoffs["dag_run"], self.policy.keep_last_runs
        scan = run_scan(cutoff=cutoff, keep=keep)
        candidates = run_candidates(cutoff=cutoff, keep=keep, audit_from=self.audit_from)
        size = max(1, self.batch_size // RUN_BATCH_DIVISOR)
        last = 0
        while not self.out_of_time():
            ids = list(scan.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:size])
            if not ids:
                return
            last = ids[-1]
            self._batch("dag_run", functools.partial(self._run_steps, candidates, ids))

    def _run_steps(self, candidates: QuerySet, ids: list[int]) -> list[tuple[str, QuerySet]]:
        if self.dry_run:
            runs = list(candidates.filter(id__in=ids).order_by("id").values_list("id", flat=True))
            ti_ids = list(
                TaskInstance.objects.filter(dag_run_id__in=runs).values_list("id", flat=True)
            )
            self.assumed_deleted_runs.update(runs)
        else:
            # Rechecked under lock: a run (or a task instance) cleared, or held by anyone, since
            # it was selected stays.
            runs, ti_ids = locks.lock_runs_for_retention(candidates.filter(id__in=ids))
            # A completed backfill's planned dates keep their row without the run (the model's
            # SET_NULL; these deletes are raw, and the deferred foreign key would fail the
            # commit).
            BackfillDagRun.objects.filter(dag_run_id__in=runs).update(dag_run=None)
        pairs = list(DagRun.objects.filter(id__in=runs).values_list("dag_id", "run_id"))
        if self.dry_run:
            self.assumed_deleted_pairs.update(pairs)
        return _run_rows(runs, ti_ids, pairs)

    # --- XComs, events, audit entries: (age, id) keysets -----------------------------------

    def _clean_by_age(
        self,
        table: str,
        candidates: QuerySet,
        column: str,
        steps: Callable[[list[int]], list[tuple[str, QuerySet]]],
        keep: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        after: tuple[Any, int] | None = None
        while not self.out_of_time():
            rows = list(
                _time_keyset(candidates, column, after).values_list(column, "id")[: self.batch_size]
            )
            if not rows:
                return
            after = rows[-1]
            ids = [pk for _, pk in rows]
            if keep is not None:
                ids = keep(ids)
            if ids:
                self._batch(table, functools.partial(steps, ids))

    def _clean_xcom(self) -> None:
        candidates = xcom_candidates(cutoff=self.cutoffs["xcom"], keep=self.policy.keep_last_runs)
        self._clean_by_age(
            "xcom",
            candidates,
            "timestamp",
            lambda ids: [("xcom", XCom.objects.filter(id__in=ids))],
            keep=self._not_counted_with_runs if self.dry_run else None,
        )

    def _not_counted_with_runs(self, ids: list[int]) -> list[int]:
        """Dry run: the XComs whose run the run step would not delete (it counted those)."""
        rows = XCom.objects.filter(id__in=ids).values_list("id", "dag_id", "run_id")
        return [
            pk for pk, dag_id, run_id in rows if (dag_id, run_id) not in self.assumed_deleted_pairs
        ]

    def _clean_task_state_store(self) -> None:
        self._clean_by_age(
            "task_state_store",
            TaskStateStore.objects.filter(expires_at__lt=self.cutoffs["task_state_store"]),
            "expires_at",
            lambda ids: [("task_state_store", TaskStateStore.objects.filter(id__in=ids))],
            keep=self._state_not_counted_with_runs if self.dry_run else None,
        )

    def _state_not_counted_with_runs(self, ids: list[int]) -> list[int]:
        """Dry run: the expired keys whose run the run step would not delete."""
        rows = TaskStateStore.objects.filter(id__in=ids).values_list("id", "dag_run_id")
        return [pk for pk, run in rows if run not in self.assumed_deleted_runs]

    def _clean_asset_event(self) -> None:
        candidates = event_candidates(
            cutoff=self.cutoffs["asset_event"], audit_from=self.audit_from, linked_ok=self.dry_run
        )
        self._clean_by_age(
            "asset_event",
            candidates,
            "timestamp",
            lambda ids: [
                ("asset_alias_event", AssetAliasEvent.objects.filter(asset_event_id__in=ids)),
                ("asset_event", AssetEvent.objects.filter(id__in=ids)),
            ],
            keep=self._not_consumed_by_kept_runs if self.dry_run else None,
        )

    def _not_consumed_by_kept_runs(self, ids: list[int]) -> list[int]:
        """Dry run: the events whose every consuming run is one the run step would delete."""
        links = DagRunAssetEvent.objects.filter(asset_event_id__in=ids)
        kept = {
            event_id
            for event_id, run_id in links.values_list("asset_event_id", "dag_run_id")
            if run_id not in self.assumed_deleted_runs
        }
        return [pk for pk in ids if pk not in kept]

    def _clean_audit_entry(self) -> None:
        self._clean_by_age(
            "audit_entry",
            audit_candidates(cutoff=self.cutoffs["audit_entry"]),
            "at",
            lambda ids: [
                ("audit_target", AuditTarget.objects.filter(entry_id__in=ids)),
                ("audit_entry", AuditEntry.objects.filter(id__in=ids)),
            ],
        )

    def _clean_webhook_delivery(self) -> None:
        self._clean_by_age(
            "webhook_delivery",
            WebhookDelivery.objects.filter(
                created_at__lt=self.cutoffs["webhook_delivery"],
                state__in=FINISHED_DELIVERY_STATES,
            ),
            "created_at",
            lambda ids: [
                ("webhook_attempt", WebhookAttempt.objects.filter(delivery_id__in=ids)),
                ("webhook_delivery", WebhookDelivery.objects.filter(id__in=ids)),
            ],
        )


def clean(
    *,
    tables: Iterable[str] | None = None,
    before: datetime | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
    sleep_ratio: float | None = None,
    time_budget_seconds: float | None = None,
    export_dir: str | None = None,
    actor: audit.Actor | None = None,
    progress: Progress | None = None,
    now: datetime | None = None,
) -> CleanResult:
    """Delete (or, `dry_run`, count) what the policy lets go, table by table in `TABLES` order,
    pausing `sleep_ratio` (default `RETENTION_SLEEP_RATIO`) times each batch's duration after it.

    A clean that deletes records itself: the `retention` heartbeat (the dashboard's line, the
    metrics) and an audit entry with the counts. A failure records a failed heartbeat and the
    `retention_failures` counter, then raises `RetentionError`: the batches already committed
    stay deleted, the failed one is rolled back whole. Options it cannot take raise
    `InvalidOptions` before anything runs, and are not recorded as a failure.
    """
    now = now or timezone.now()
    chosen = tuple(TABLES if not tables else [t for t in TABLES if t in set(tables)])
    unknown = sorted(set(tables or ()) - set(TABLES))
    if unknown:
        raise InvalidOptions(
            f"unknown table(s) {', '.join(unknown)}: choose from {', '.join(TABLES)}"
        )
    size = int(settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size)
    if size < 1:
        raise InvalidOptions(f"the batch size must be at least 1 (got {size})")
    ratio = float(settings.RETENTION_SLEEP_RATIO if sleep_ratio is None else sleep_ratio)
    if not ratio >= 0:
        raise InvalidOptions(f"the sleep ratio must be 0 or more (got {ratio:g})")
    if before is not None and before > now:
        raise InvalidOptions(f"--clean-before-timestamp {before.isoformat()} is in the future")
    try:
        work = _Clean(
            policy=Policy.from_settings(),
            tables=chosen,
            now=now,
            before=before,
            dry_run=dry_run,
            batch_size=size,
            sleep_ratio=ratio,
            deadline=None
            if time_budget_seconds is None
            else time.monotonic() + time_budget_seconds,
            export_dir=settings.RETENTION_EXPORT_DIR if export_dir is None else export_dir,
            progress=progress,
        )
        result = work.run()
    except Exception as error:
        if not dry_run:
            _record_failure(error)
        if isinstance(error, RetentionError):
            raise
        raise RetentionError(f"retention failed: {type(error).__name__}: {error}") from error
    if not dry_run:
        _record_success(result, actor=actor)
    return result


def _record_success(result: CleanResult, *, actor: audit.Actor | None) -> None:
    heartbeats.record(component=COMPONENT, ok=True, detail=result.summary())
    if result.total:
        metrics.incr(metrics.RETENTION_ROWS_DELETED, result.total)
        with transaction.atomic(durable=True):
            audit.record(
                actor=actor,
                action="retention.clean",
                summary=f"retention deleted {result.total} row(s): "
                + ", ".join(f"{n} {t}" for t, n in sorted(result.counts.items()) if n),
                detail=result.summary(),
            )


def _record_failure(error: Exception) -> None:
    logger.error("retention failed", exc_info=error)
    heartbeats.record(
        component=COMPONENT,
        ok=False,
        detail={"error": _first_line(error)},
    )
    metrics.incr(metrics.RETENTION_FAILURES)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def periodic_clean(*, now: datetime | None = None) -> CleanResult | None:
    """The timers process's clean (the retention timer, `next_clean_at`): nothing unless
    RETENTION_PERIODIC is on and the last clean is RETENTION_INTERVAL_MINUTES old; then at most
    RETENTION_TIME_BUDGET_SECONDS of batches (a clean cut short goes on at the next interval)."""
    now = now or timezone.now()
    due = next_clean_at(now=now)
    if due is None or due > now:
        return None
    return clean(
        time_budget_seconds=max(float(settings.RETENTION_TIME_BUDGET_SECONDS), 1.0),
        actor=audit.SYSTEM,
        now=now,
    )


def next_clean_at(*, now: datetime | None = None) -> datetime | None:
    """When the periodic clean is next due: RETENTION_INTERVAL_MINUTES after the last clean
    (`now` when there was none), None when RETENTION_PERIODIC is off. One read."""
    if not settings.RETENTION_PERIODIC:
        return None
    last = (
        ComponentHeartbeat.objects.filter(component=COMPONENT)
        .values_list("last_run_at", flat=True)
        .first()
    )
    if last is None:
        return now or timezone.now()
    return last + timedelta(minutes=float(settings.RETENTION_INTERVAL_MINUTES))


# --- a Dag's deletion (`DELETE /api/v2/dags/{dag_id}`): the second caller of the deleter -------

# Attempts at a batch whose rows someone holds (SKIP LOCKED left it empty) before the deletion
# gives up with a 409; each waits DAG_DELETION_RETRY_SECONDS.
DAG_DELETION_ATTEMPTS = 50
DAG_DELETION_RETRY_SECONDS = 0.1


@dataclass
class DagDeletion:
    dag_id: str
    counts: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    longest_transaction_ms: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, table: str, n: int) -> None:
        self.counts[table] = self.counts.get(table, 0) + n


def _still_running(dag_id: str) -> exceptions.Conflict:
    return exceptions.Conflict(
        f"Task instances of dag with id: '{dag_id}' are still running",
        reason="task_instances_running",
    )


def delete_dag(
    *, dag_id: str, actor: audit.Actor | None = None, batch_size: int | None = None
) -> DagDeletion:
    """Airflow's `delete_dag` (`airflow/api/common/delete_dag.py`), by retention's deleter:
    the Dag and every row keyed by it (runs with their TIs, rendered fields, reschedules, logs,
    consumed-event links, XComs and state keys; its ADRQ rows; backfills; tasks and schedule
    references; the import errors of its file), in short batches (`RETENTION_BATCH_SIZE`, runs
    by a fifth of it), children first. Kept, as Airflow keeps them: the asset events its tasks
    produced (history of the asset; `source_dag_id` is only a label) and the audit trail; and,
    as retention keeps them, outbox rows (the drain registers them from their payload).

    A running TI refuses the deletion with `Conflict` (Airflow's 409), checked first and again
    under each run batch's locks: batches committed before a TI started stay deleted. Unknown
    Dag -> NotFound. Audited once (`dag.delete`, the counts) in the last transaction, which
    deletes the Dag row; a run created meanwhile is deleted in another batch first. Each batch
    is its own durable transaction; nothing waits on a lock (SKIP LOCKED, retried briefly)."""
    if not Dag.objects.filter(dag_id=dag_id).exists():
        raise exceptions.NotFound(f"Dag with id: {dag_id} was not found", reason="dag_not_found")
    if TaskInstance.objects.filter(dag_id=dag_id, state=TIState.RUNNING).exists():
        raise _still_running(dag_id)
    size = int(settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size)
    result = DagDeletion(dag_id=dag_id)
    idle = 0
    while True:
        progress = _delete_dag_runs(dag_id, size, result)
        progress |= _delete_by_id(
            AssetDagRunQueue, "asset_dag_run_queue", size, result, target_dag_id=dag_id
        )
        progress |= _delete_by_id(XCom, "xcom", size, result, dag_id=dag_id)
        if not progress and _delete_dag_row(dag_id, result, actor=actor):
            return result
        if not progress:
            idle += 1
            if idle >= DAG_DELETION_ATTEMPTS:
                raise exceptions.Conflict(
                    f"Dag with id: '{dag_id}' is busy (its rows stayed locked): try again",
                    reason="dag_busy",
                )
            time.sleep(DAG_DELETION_RETRY_SECONDS)
        else:
            idle = 0


def _timed(result: DagDeletion, work: Callable[[], bool]) -> bool:
    started = time.monotonic()
    with transaction.atomic(durable=True):
        done = work()
    result.batches += 1
    result.longest_transaction_ms = max(
        result.longest_transaction_ms, (time.monotonic() - started) * 1000
    )
    return done


def _delete_dag_runs(dag_id: str, size: int, result: DagDeletion) -> bool:
    """The Dag's runs, batch by batch; True if any went."""
    deleted = False
    last = 0
    while True:
        ids = list(
            DagRun.objects.filter(dag_id=dag_id, id__gt=last)
            .order_by("id")
            .values_list("id", flat=True)[: max(1, size // RUN_BATCH_DIVISOR)]
        )
        if not ids:
            return deleted
        last = ids[-1]

        def batch(ids: list[int] = ids) -> bool:
            runs, ti_ids, running = locks.lock_runs_for_dag_deletion(ids)
            if running:
                raise _still_running(dag_id)
            if not runs:
                return False
            BackfillDagRun.objects.filter(dag_run_id__in=runs).update(dag_run=None)
            pairs = list(DagRun.objects.filter(id__in=runs).values_list("dag_id", "run_id"))
            for name, queryset in _run_rows(runs, ti_ids, pairs):
                result.add(name, retention_sql.delete_rows(queryset))
            return True

        deleted |= _timed(result, batch)


def _delete_by_id(model: Any, name: str, size: int, result: DagDeletion, **where: Any) -> bool:
    """Rows of `model` matching `where`, `size` ids per transaction; True if any went."""
    deleted = False
    while True:
        ids = list(model.objects.filter(**where).order_by("id").values_list("id", flat=True)[:size])
        if not ids:
            return deleted

        def batch(ids: list[int] = ids) -> bool:
            result.add(name, retention_sql.delete_rows(model.objects.filter(id__in=ids)))
            return True

        deleted |= _timed(result, batch)


def _delete_dag_row(dag_id: str, result: DagDeletion, *, actor: audit.Actor | None) -> bool:
    """The last transaction: the Dag row locked (False: held, or a run appeared: go round
    again), its definition rows, backfills and file's import errors deleted, the audit entry."""

    def last() -> bool:
        dag = locks.lock_dag_for_deletion(dag_id)
        if dag is None or DagRun.objects.filter(dag_id=dag_id).exists():
            return False
        tasks = Q(task__dag_id=dag_id)
        steps: list[tuple[str, QuerySet]] = [
            ("task_upstream", TaskUpstream.objects.filter(tasks)),
            ("task_setup_link", TaskSetupLink.objects.filter(tasks)),
            ("task_outlet_asset_reference", TaskOutletAssetReference.objects.filter(tasks)),
            ("task_outlet_alias_reference", TaskOutletAliasReference.objects.filter(tasks)),
            ("task", Task.objects.filter(dag_id=dag_id)),
            (
                "dag_schedule_asset_reference",
                DagScheduleAssetReference.objects.filter(dag_id=dag_id),
            ),
            (
                "dag_schedule_alias_reference",
                DagScheduleAliasReference.objects.filter(dag_id=dag_id),
            ),
            ("watcher_route", WatcherRoute.objects.filter(dag_id=dag_id)),
            ("dag_callback_request", DagCallbackRequest.objects.filter(dag_id=dag_id)),
            ("dagrun_asset_event", DagRunAssetEvent.objects.filter(dag_id=dag_id)),
            ("asset_dag_run_queue", AssetDagRunQueue.objects.filter(target_dag_id=dag_id)),
            ("backfill_dag_run", BackfillDagRun.objects.filter(backfill__dag_id=dag_id)),
            ("backfill", Backfill.objects.filter(dag_id=dag_id)),
            (
                "import_error",
                DagImportError.objects.filter(filename=dag.fileloc)
                if dag.fileloc
                else DagImportError.objects.none(),
            ),
            ("dag_favorite", DagFavorite.objects.filter(dag_id=dag_id)),
            ("dag_version", DagVersion.objects.filter(dag_id=dag_id)),
            # The file's source goes with its last Dag (Airflow's dag_code goes with the Dag's
            # versions); a file that still holds other Dags keeps it.
            (
                "dag_code",
                DagCode.objects.filter(fileloc=dag.fileloc)
                if dag.fileloc
                and not Dag.objects.filter(fileloc=dag.fileloc).exclude(dag_id=dag_id).exists()
                else DagCode.objects.none(),
            ),
            ("dag", Dag.objects.filter(dag_id=dag_id)),
        ]
        for name, queryset in steps:
            result.add(name, retention_sql.delete_rows(queryset))
        audit.record(
            actor=actor,
            action="dag.delete",
            summary=f"deleted Dag {dag_id} and {result.total - 1} row(s) of it: "
            + ", ".join(f"{n} {t}" for t, n in sorted(result.counts.items()) if n),
            dag_id=dag_id,
            detail={"counts": {t: n for t, n in sorted(result.counts.items()) if n}},
        )
        return True

    return _timed(result, last)


def delete_dag_run(*, dag_id: str, run_id: str, actor: audit.Actor | None = None) -> DagDeletion:
    """Airflow's `DELETE /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}` by retention's deleter:
    one run (queued, success or failed; running -> Conflict with Airflow's message) with
    everything that goes with a run (`_run_rows`), in one short transaction under its locks
    (SKIP LOCKED: a run or TI someone holds right now -> Conflict, try again), audited
    (`dag_run.delete`). Beyond Airflow, a queued run with a running TI is refused too (the
    worker's work). Its consumed events and the outbox rows of its TIs stay. Unknown run ->
    NotFound."""
    result = DagDeletion(dag_id=dag_id)
    found = DagRun.objects.filter(dag_id=dag_id, run_id=run_id).values_list("pk", "state").first()
    if found is None:
        raise exceptions.NotFound(
            f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
            reason="dag_run_not_found",
        )
    pk, state = found
    if state == DagRunState.RUNNING:
        raise exceptions.Conflict(
            f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` cannot be deleted in "
            f"{state} state",
            reason="run_running",
        )

    def batch() -> bool:
        runs, ti_ids, running = locks.lock_runs_for_dag_deletion([pk])
        state_now = DagRun.objects.filter(pk=pk).values_list("state", flat=True).first()
        if running or state_now == DagRunState.RUNNING:
            raise exceptions.Conflict(
                f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` cannot be deleted "
                "in running state",
                reason="run_running",
            )
        if not runs:
            raise exceptions.Conflict(
                f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` is held by another "
                "change right now: try again",
                reason="run_busy",
            )
        BackfillDagRun.objects.filter(dag_run_id__in=runs).update(dag_run=None)
        for name, queryset in _run_rows(runs, ti_ids, [(dag_id, run_id)]):
            result.add(name, retention_sql.delete_rows(queryset))
        audit.record(
            actor=actor,
            action="dag_run.delete",
            summary=f"deleted run {run_id} of {dag_id} and {result.total - 1} row(s) of it",
            targets=[audit.Target(kind="dag_run", object_id=pk)],
            dag_id=dag_id,
            detail={
                "run_id": run_id,
                "counts": {t: n for t, n in sorted(result.counts.items()) if n},
            },
        )
        return True

    _timed(result, batch)
    return result


def delete_task_instance(
    *, dag_id: str, run_id: str, task_id: str, map_index: int = -1, actor: audit.Actor | None = None
) -> DagDeletion:
    """Airflow's `DELETE .../taskInstances/{task_id}` by retention's deleter: one TI with its
    rendered fields, reschedules, logs, HITL detail and XComs (Airflow's XCom rows go with their
    TI), in one short transaction under the TI's lock, audited (`task_instance.delete`). Beyond
    Airflow, a running TI (or one a worker holds right now: SKIP LOCKED) is refused with a
    Conflict: it is a worker's work. Unknown TI -> NotFound in Airflow's words."""
    result = DagDeletion(dag_id=dag_id)
    where = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index}
    name = f"{dag_id}.{task_id} of run {run_id} (map index {map_index})"

    def batch() -> bool:
        found = TaskInstance.objects.filter(**where).values_list("id", "state").first()
        if found is None:
            raise exceptions.NotFound(
                f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
                f"`{task_id}` and map_index: `{map_index}` was not found",
                reason="task_instance_not_found",
            )
        ti_id, _ = found
        state = locks.lock_task_instance_for_deletion(ti_id)
        if state is None or state == TIState.RUNNING:
            raise exceptions.Conflict(
                f"Task instance {name} is running (or held by its worker right now): it is not "
                "deleted",
                reason="task_instance_running",
            )
        steps = [
            ("rendered_task_fields", RenderedTaskFields.objects.filter(ti_id=ti_id)),
            ("task_reschedule", TaskReschedule.objects.filter(ti_id=ti_id)),
            ("task_log_chunk", TaskLogChunk.objects.filter(ti_id=ti_id)),
            ("hitl_detail", HITLDetail.objects.filter(ti_id=ti_id)),
            ("xcom", XCom.objects.filter(**where)),
            ("task_instance", TaskInstance.objects.filter(id=ti_id)),
        ]
        for table, queryset in steps:
            result.add(table, retention_sql.delete_rows(queryset))
        audit.record(
            actor=actor,
            action="task_instance.delete",
            summary=f"deleted task instance {name}",
            targets=[audit.Target(kind="task_instance", object_id=ti_id, ti_id=ti_id)],
            dag_id=dag_id,
            detail={"run_id": run_id, "task_id": task_id, "map_index": map_index},
        )
        return True

    _timed(result, batch)
    return result
