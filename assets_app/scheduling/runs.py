"""Creating DagRuns and their task instances: manual triggers and (through the scheduler)
asset-triggered runs.

`create_dag_run` (one run) and `create_asset_triggered_runs` (the scheduler's runs of a batch of
Dags) are the only places a DagRun is inserted, both through `_insert_runs`. They run inside the
caller's transaction and issue a fixed number of queries whatever the number of runs, tasks or
consumed events.

Manual runs and `max_active_runs`: like Airflow 3, a manual trigger is always accepted and the
run is created `queued`; Airflow's scheduler then applies `max_active_runs` when it moves queued
runs to running. This service has no such start step (workers claim queued TIs directly), so a
manual run is created regardless of how many runs are active; only the asset scheduler counts
active runs before it creates one.

Paused Dags: a trigger (or a clear) of a paused Dag is accepted, as Airflow's, and the run stays
`queued` until the Dag is unpaused: the claim takes no TI of a paused Dag (`sql/claims`), as
Airflow's scheduler starts no queued run of one and queues none of its TIs.
"""

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError, models, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.crypto import get_random_string

from ..definitions import params as dag_params
from ..definitions import setup_teardown
from ..guards import exceptions, limits, masking, run_ids
from ..models import (
    Dag,
    DagRun,
    DagRunState,
    DagRunTriggeredBy,
    DagRunType,
    Task,
    TaskInstance,
    TaskOutletAssetReference,
    TaskUpstream,
    TIState,
)
from ..models.runs import TI_FINISHED_STATES, first_try_number, fresh_try_values
from ..operations import audit
from ..sql import locks
from ..sql import scheduling as scheduling_sql
from . import dependencies

RUN_ID_SUFFIX_LENGTH = 8
RUN_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def generate_run_id(*, run_type: str, run_after: datetime) -> str:
    """`<run_type>__<iso timestamp>_<random>`, Airflow's shape for runs without a logical date.

    The random suffix makes two runs created in the same microsecond distinct.
    """
    suffix = get_random_string(RUN_ID_SUFFIX_LENGTH, RUN_ID_ALPHABET)
    return f"{run_type}__{run_after.isoformat()}_{suffix}"


def initial_ti_states(
    *, dag_id: str, task_ids: Sequence[str], with_upstream: Collection[str] | None = None
) -> dict[str, str]:
    """The state each of these tasks' TIs starts in, when a run is created and when TIs are
    cleared or added: the one place that decides it. A task with no upstream task (a root) is
    queued; the others wait (`scheduled`, not claimable) until `dependencies.evaluate` finds
    their trigger rule met, and so does a root that depends on the past (issue 39: its
    previous run's TI may not be done; Airflow's `PrevDagrunDep`). Callers that cleared or
    added TIs of an existing run evaluate it after their commit, since some upstream may
    already be done.

    `with_upstream`: those of `task_ids` that have upstream tasks or depend on the past, when
    the caller read them already (run creation reads them with the tasks); otherwise one
    query."""
    if with_upstream is None:
        with_upstream = set(
            Task.objects.filter(dag_id=dag_id, task_id__in=list(task_ids))
            .filter(
                Exists(TaskUpstream.objects.filter(task_id=OuterRef("pk")))
                | models.Q(depends_on_past=True)
            )
            .values_list("task_id", flat=True)
        )
    return {
        task_id: TIState.SCHEDULED if task_id in with_upstream else TIState.QUEUED
        for task_id in task_ids
    }


class NewTask(NamedTuple):
    """What creating a run needs of one of its Dag's tasks."""

    task_id: str
    retries: int
    has_upstream: bool
    # A task mapped over a literal list of this many values (issue 25): its TIs are map
    # indexes 0..n-1 from the start, as Airflow's `DagRun._create_tasks` does; None (not mapped,
    # or mapped over an upstream's return value) and 0 get the one TI of map index -1, which
    # the evaluation expands once its trigger rule is met (`mapping`).
    map_length: int | None = None
    # Airflow's depends_on_past (issue 39): even a root waits, for its previous run's TI.
    depends_on_past: bool = False

    def map_indexes(self) -> range:
        return range(self.map_length) if self.map_length else range(-1, 0)


def dag_tasks(dag_ids: Sequence[str]) -> dict[str, list[NewTask]]:
    """Each of `dag_ids`' tasks by task id (a Dag without tasks: []), in one query."""
    tasks: dict[str, list[NewTask]] = {dag_id: [] for dag_id in dag_ids}
    for dag_id, task_id, retries, has_upstream, map_length, depends_on_past in (
        Task.objects.filter(dag_id__in=list(dag_ids))
        .annotate(has_upstream=Exists(TaskUpstream.objects.filter(task_id=OuterRef("pk"))))
        .order_by("dag_id", "task_id")
        .values_list(
            "dag_id", "task_id", "retries", "has_upstream", "map_length", "depends_on_past"
        )
    ):
        tasks[dag_id].append(NewTask(task_id, retries, has_upstream, map_length, depends_on_past))
    return tasks


def create_dag_run(
    *,
    dag: Dag,
    run_type: str,
    run_id: str | None = None,
    run_after: datetime,
    conf: Mapping[str, Any] | None = None,
    triggering_user_name: str | None = None,
    consumed_event_ids: Iterable[int] = (),
    logical_date: datetime | None = None,
    data_interval_start: datetime | None = None,
    data_interval_end: datetime | None = None,
    note: str | None = None,
    triggered_by: str | None = None,
) -> DagRun:
    """Insert a queued DagRun, its consumed-event links and one TI per task of `dag` (queued for
    roots, waiting for the others: `initial_ti_states`), one per map index for a task mapped
    over a literal (`NewTask.map_indexes`).

    Runs inside the caller's transaction and takes no locks. Queries: 1 for the tasks, 1 for
    the run, 1 for the consumed-event links when there are any, 1 for the TIs when there are
    any. An explicit `run_id` adds a savepoint around the inserts (2 more queries): one already
    used by this Dag raises `exceptions.Conflict` (reason "dag_run_exists") and leaves the
    caller's transaction usable; so does a `logical_date` (a date another run of the Dag holds
    is that Conflict too). (The scheduler creates its runs, a batch of Dags at once, with
    `create_asset_triggered_runs`.)
    """
    if run_type not in DagRunType.values:
        raise exceptions.InvalidInput(f"unknown run type {run_type!r}", reason="invalid_run_type")
    run = DagRun(
        dag=dag,
        run_id=run_id or generate_run_id(run_type=run_type, run_after=run_after),
        run_type=run_type,
        state=DagRunState.QUEUED,
        run_after=run_after,
        logical_date=logical_date,
        data_interval_start=data_interval_start,
        data_interval_end=data_interval_end,
        conf=dict(conf or {}),
        triggering_user_name=triggering_user_name,
        triggered_by=triggered_by
        or (DagRunTriggeredBy.ASSET if run_type == DagRunType.ASSET_TRIGGERED else None),
        note=note,
    )
    tasks = dag_tasks([dag.dag_id])[dag.dag_id]
    event_ids = list(dict.fromkeys(consumed_event_ids))
    if run_id is None and logical_date is None:
        # A generated run_id carries 8 random characters: a clash is not a case to prepare a
        # savepoint for on every run; it would be an IntegrityError.
        _insert_runs([(run, event_ids, tasks)])
    else:
        try:
            with transaction.atomic():
                _insert_runs([(run, event_ids, tasks)])
        except IntegrityError as exc:
            if DagRun.objects.filter(dag=dag, run_id=run.run_id).exists():
                raise exceptions.Conflict(
                    f"dag {dag.dag_id!r} already has a run with run_id {run.run_id!r}",
                    reason="dag_run_exists",
                ) from exc
            # Issue 24: one run per (Dag, logical_date), as Airflow (dag_run_logical_date_unique).
            if DagRun.objects.filter(dag=dag, logical_date=logical_date).exists():
                raise exceptions.Conflict(
                    f"dag {dag.dag_id!r} already has a run with logical_date "
                    f"{logical_date.isoformat()}",  # type: ignore[union-attr]
                    reason="dag_run_exists",
                ) from exc
            raise
    return run


@dataclass(frozen=True)
class PlannedRun:
    """An asset-triggered run the scheduler decided to create: its Dag, `run_after`, the events
    it consumes and the Dag's tasks as `dag_tasks` reads them (sorted by task_id)."""

    dag_id: str
    run_after: datetime
    consumed_event_ids: Sequence[int]
    tasks: Sequence[NewTask]


def create_asset_triggered_runs(*, planned: Sequence[PlannedRun]) -> list[DagRun]:
    """Insert one queued asset-triggered run per item, with its consumed-event links and one TI
    per task (queued for roots, waiting for the others: `initial_ti_states`), and return the
    runs in the order of `planned`.

    Runs inside the caller's transaction and takes no locks. 3 queries whatever the number of
    runs, events and tasks: the runs, the links (none
    without events), the TIs (none without tasks). Generated run_ids (see `create_dag_run`).
    """
    items = [
        (
            DagRun(
                dag_id=item.dag_id,
                run_id=generate_run_id(
                    run_type=DagRunType.ASSET_TRIGGERED, run_after=item.run_after
                ),
                run_type=DagRunType.ASSET_TRIGGERED,
                state=DagRunState.QUEUED,
                run_after=item.run_after,
                conf={},
                triggered_by=DagRunTriggeredBy.ASSET,
            ),
            list(dict.fromkeys(item.consumed_event_ids)),
            item.tasks,
        )
        for item in planned
    ]
    _insert_runs(items)
    return [run for run, _, _ in items]


def _insert_runs(
    items: Sequence[tuple[DagRun, Sequence[int], Sequence[NewTask]]],
) -> None:
    """INSERT unsaved runs (reading back their ids), then the consumed-event links and TIs of
    all of them: (run, distinct event ids, tasks as `dag_tasks` reads them). Inside the
    caller's transaction; one statement each for runs (`scheduling_sql.insert_rows`), links
    (`scheduling_sql.insert_consumed_links`: no model instance per link) and TIs
    (`scheduling_sql.insert_rows`; links and TIs only when there are any). No signals are
    connected to these models, which neither would send."""
    if not items:
        return
    scheduling_sql.insert_rows(DagRun, [run for run, _, _ in items])
    scheduling_sql.insert_consumed_links(
        [(run.pk, event_ids) for run, event_ids, _ in items if event_ids]
    )
    now = timezone.now()
    tis = []
    for run, _, tasks in items:
        states = initial_ti_states(
            dag_id=run.dag_id,
            task_ids=[task.task_id for task in tasks],
            with_upstream={
                task.task_id for task in tasks if task.has_upstream or task.depends_on_past
            },
        )
        # A root that depends on the past waits (issue 39); its previous run's TI may well be
        # done already, so the run's waiting TIs are evaluated after the commit: one statement
        # more, only for runs of Dags with such a root (the sweep repairs a crash before it).
        if any(t.depends_on_past and not t.has_upstream for t in tasks):
            transaction.on_commit(
                functools.partial(dependencies.evaluate, dag_run_id=run.pk, finished_task_ids=None)
            )
        # A root mapped over an empty literal has nothing to wait for: its map-index -1 TI is
        # skipped at once (Airflow expands it to skipped on the scheduler's first look), and its
        # downstream evaluated after the commit.
        empty = [t.task_id for t in tasks if t.map_length == 0 and not t.has_upstream]
        if empty:
            states.update(dict.fromkeys(empty, TIState.SKIPPED))
            transaction.on_commit(
                functools.partial(
                    dependencies.follow_finishes,
                    dag_run_id=run.pk,
                    dag_id=run.dag_id,
                    finished_task_ids=empty,
                )
            )
        tis += [
            TaskInstance(
                dag_run_id=run.pk,
                dag_id=run.dag_id,
                run_id=run.run_id,
                task_id=task.task_id,
                map_index=map_index,
                try_number=first_try_number(states[task.task_id]),
                max_tries=task.retries,
                state=states[task.task_id],
                queued_at=now,
                end_date=now if states[task.task_id] == TIState.SKIPPED else None,
            )
            for task in tasks
            for map_index in task.map_indexes()
        ]
    scheduling_sql.insert_rows(TaskInstance, tis)


def trigger_dag(
    *,
    dag_id: str,
    conf: Any = None,
    triggering_user_name: str | None = None,
    run_id: str | None = None,
    run_after: datetime | None = None,
    logical_date: datetime | None = None,
    data_interval_start: datetime | None = None,
    data_interval_end: datetime | None = None,
    note: str | None = None,
    actor: audit.Actor | None = None,
    triggered_by: str | None = None,
    run_type: str = DagRunType.MANUAL,
) -> DagRun:
    """Create a manual run of `dag_id` with its queued TIs, in its own durable transaction,
    audited when `actor` is given (an operator's trigger; the scheduler's runs are not).
    `run_type` is asset_materialization for `materialize_asset`.

    A paused Dag's run is created as any other and waits, queued, for the unpause (Airflow
    3.3.2's `trigger_dag_run` does not look at the pause; the claim does, `sql/claims`).

    Errors (nothing written): unknown Dag -> NotFound ("dag_not_found"); `conf` not a JSON
    object -> InvalidInput ("invalid_conf"), nested deeper than `limits.MAX_JSON_DEPTH` ->
    InvalidInput ("too_deep"), wider or larger than the other `limits` -> InvalidInput
    ("too_wide" / "too_long" / "too_large"); a `run_id` already used by the Dag -> Conflict
    ("dag_run_exists"). Manual runs are not limited by `max_active_runs` (see the module
    docstring). A conf the Dag's params refuse -> BadRequest ("value_error", Airflow's `Invalid
    input for param ...`); a run type the Dag's `allowed_run_types` leave out -> BadRequest
    ("denied_run_type").
    """
    if conf is None:
        conf = {}
    if not isinstance(conf, dict):
        raise exceptions.InvalidInput(
            f"conf must be a JSON object, got {type(conf).__name__}", reason="invalid_conf"
        )
    limits.check_json(conf, field="conf", loc=("body", "conf"))
    if run_id is not None:  # issue 26: Airflow's allowed pattern, on every door
        run_ids.check_run_id(run_id)
    with transaction.atomic(durable=True):
        dag = Dag.objects.filter(dag_id=dag_id).first()
        if dag is None:
            raise exceptions.NotFound(f"dag {dag_id!r} does not exist", reason="dag_not_found")
        check_run_type(dag, run_type)
        dag_params.check_conf(dag_params.load(dag.params), conf)
        run = create_dag_run(
            dag=dag,
            run_type=run_type,
            triggered_by=triggered_by,
            run_id=run_id,
            run_after=run_after or timezone.now(),
            conf=conf,
            triggering_user_name=triggering_user_name,
            logical_date=logical_date,
            data_interval_start=data_interval_start,
            data_interval_end=data_interval_end,
            note=note,
        )
        if actor is not None:
            audit.record(
                actor=actor,
                action="dag_run.trigger",
                summary=f"triggered run {run.run_id} of dag {dag_id}",
                targets=[audit.Target(kind="dag_run", object_id=run.pk)],
                dag_id=dag_id,
                detail={"run_id": run.run_id, "conf": masking.redact(conf)},
            )
        return run


# Airflow's refusal of each run type a Dag's `allowed_run_types` leaves out, door by door (its
# public trigger, execution API, materialize and backfill routes word them differently).
_DENIED: dict[str, str] = {
    DagRunType.MANUAL: "Dag with dag_id: '{}' does not allow manual runs",
    DagRunType.OPERATOR_TRIGGERED: "Dag with dag_id '{}' does not allow operator-triggered runs",
    DagRunType.ASSET_MATERIALIZATION: (
        "Dag with dag_id: '{}' does not allow asset materialization runs"
    ),
    DagRunType.BACKFILL: "Dag with dag_id: '{}' does not allow backfill runs",
}


def check_run_type(dag: Dag, run_type: str) -> None:
    """BadRequest (400, "denied_run_type", Airflow's words) when the Dag's `allowed_run_types`
    leave `run_type` out. The scheduled and asset-triggered runs the Dag's own schedule makes
    are always among them (the definition's check)."""
    if dag.allowed_run_types is not None and run_type not in dag.allowed_run_types:
        text = _DENIED.get(run_type, "Dag with dag_id: '{}' does not allow " + run_type + " runs")
        raise exceptions.BadRequest(text.format(dag.dag_id), reason="denied_run_type")


def materialize_asset(*, asset_id: int, **trigger: Any) -> DagRun:
    """Run the one Dag that produces `asset_id` (a task declares it as an outlet), as
    `trigger_dag` does, with run type asset_materialization. NotFound when no Dag produces it,
    Conflict (`several_producers`) when more than one does; `trigger_dag`'s errors otherwise."""
    dag_ids = list(
        TaskOutletAssetReference.objects.filter(asset_id=asset_id)
        .order_by("task__dag_id")
        .values_list("task__dag_id", flat=True)
        .distinct()[:2]
    )
    if not dag_ids:
        raise exceptions.NotFound(
            f"No Dag materializes asset with ID: {asset_id}", reason="no_producing_dag"
        )
    if len(dag_ids) > 1:
        raise exceptions.Conflict(
            f"More than one Dag materializes asset with ID: {asset_id}",
            reason="several_producers",
        )
    return trigger_dag(dag_id=dag_ids[0], run_type=DagRunType.ASSET_MATERIALIZATION, **trigger)


# --- clearing -----------------------------------------------------------------------------------


def clearable_states(*, only_failed: bool = False) -> frozenset[str]:
    """The TI states a clear acts on: finished (and up_for_retry), or only failed ones."""
    if only_failed:
        return frozenset({TIState.FAILED, TIState.UPSTREAM_FAILED})
    return frozenset(TI_FINISHED_STATES | {TIState.UP_FOR_RETRY})


@dataclass(frozen=True)
class ClearResult:
    """TIs cleared (queued again for a new try) and those left alone (queued or running now,
    or held by a worker at that moment)."""

    cleared: tuple[str, ...]
    skipped: tuple[str, ...]


def clear_task_instances(
    *,
    dag_run_id: int,
    ti_ids: Sequence[Any] | None = None,
    only_failed: bool = False,
    actor: audit.Actor | None = None,
) -> ClearResult:
    """Queue a run's finished TIs (all, `ti_ids`, or only failed / upstream_failed) again for
    a new try, as Airflow's clear does: try_number + 1, max_tries = old try + the task's
    retries, host / pid / start / end / claim reset; the run goes back to queued with its
    `clear_number` + 1. Chosen `ti_ids` bring the relevant setups and teardowns of their tasks
    along, as Airflow's clear of chosen tasks (issue 39, `_cleared_with`). Queued and running
    TIs are left alone (Airflow refuses to clear a running one without stopping it), and so are
    TIs whose row a worker holds right now (SKIP LOCKED: the TI lock is never waited on here).
    Own durable transaction, audited when anything was cleared; then (after the commit) the
    run's waiting TIs are evaluated, so a cleared TI whose upstream are done is queued and the
    others wait. Unknown run: NotFound.
    """
    wanted = {str(i) for i in ti_ids} if ti_ids is not None else None
    with transaction.atomic(durable=True):
        run = DagRun.objects.filter(pk=dag_run_id).first()
        if run is None:
            raise exceptions.NotFound(
                f"dag run {dag_run_id} does not exist", reason="run_not_found"
            )
        candidates = TaskInstance.objects.filter(dag_run_id=dag_run_id)
        if wanted is not None:
            chosen = set(candidates.filter(id__in=wanted).values_list("task_id", flat=True))
            extra = _cleared_with(dag_id=run.dag_id, task_ids=chosen)
            candidates = candidates.filter(models.Q(id__in=wanted) | models.Q(task_id__in=extra))
        everything = {str(ti.id): ti.task_id for ti in candidates.only("id", "task_id")}
        clearable = clearable_states(only_failed=only_failed)
        locked = locks.lock_task_instances_to_clear(candidates.filter(state__in=sorted(clearable)))
        states = initial_ti_states(dag_id=run.dag_id, task_ids=[ti.task_id for ti in locked])
        retries = dict(
            Task.objects.filter(
                dag_id=run.dag_id, task_id__in={ti.task_id for ti in locked}
            ).values_list("task_id", "retries")
        )
        now = timezone.now()
        fresh = fresh_try_values(queued_at=now, retry_at=None)
        for ti in locked:
            ti.max_tries = ti.try_number + retries.get(
                ti.task_id, max(ti.max_tries - ti.try_number, 0)
            )
            ti.try_number += 1
            ti.state = states[ti.task_id]
            for name, value in fresh.items():
                setattr(ti, name, value)
        if locked:
            TaskInstance.objects.bulk_update(
                locked, ["max_tries", "try_number", "state", *fresh, "updated_at"]
            )
            _queue_run_again(run.pk, now=now)
            audit.record(
                actor=actor,
                action="dag_run.clear",
                summary=(
                    f"cleared {len(locked)} task instance(s) of run {run.run_id} of dag "
                    f"{run.dag_id}: {', '.join(sorted(ti.task_id for ti in locked)[:20])}"
                ),
                targets=[
                    audit.Target(kind="task_instance", object_id=ti.id, ti_id=ti.id)
                    for ti in locked
                ],
                dag_id=run.dag_id,
                detail={"run_id": run.run_id, "only_failed": only_failed},
            )
        cleared = {str(ti.id) for ti in locked}
    if locked:
        # A cleared TI waits for its upstream, some of which may be done already.
        dependencies.evaluate(dag_run_id=dag_run_id, finished_task_ids=None)
    return ClearResult(
        cleared=tuple(sorted(everything[i] for i in cleared)),
        skipped=tuple(sorted(t for i, t in everything.items() if i not in cleared)),
    )


def _cleared_with(*, dag_id: str, task_ids: set[str]) -> set[str]:
    """The setups and teardowns Airflow clears with `task_ids` (issue 39,
    `setup_teardown.cleared_with`); nothing (one query) for a Dag without them."""
    tasks = list(
        Task.objects.filter(dag_id=dag_id).values_list("pk", "task_id", "is_setup", "is_teardown")
    )
    if not any(is_setup or is_teardown for _, _, is_setup, is_teardown in tasks):
        return set()
    upstream: dict[int, list[str]] = {}
    for task_pk, upstream_id in TaskUpstream.objects.filter(task__dag_id=dag_id).values_list(
        "task_id", "upstream__task_id"
    ):
        upstream.setdefault(task_pk, []).append(upstream_id)
    nodes = [
        setup_teardown.Node(
            task_id=task_id,
            upstream=tuple(upstream.get(pk, ())),
            is_setup=is_setup,
            is_teardown=is_teardown,
        )
        for pk, task_id, is_setup, is_teardown in tasks
    ]
    return setup_teardown.cleared_with(nodes, task_ids)


@dataclass(frozen=True)
class RunClearResult:
    run: DagRun
    task_instances: list[TaskInstance]  # cleared (or, in a dry run, that would be)
    new_task_ids: list[str]  # only_new: tasks of the Dag with no TI in the run


def clear_dag_run(
    *,
    dag_id: str,
    run_id: str,
    dry_run: bool = True,
    only_failed: bool = False,
    only_new: bool = False,
    note: str | None = None,
    actor: audit.Actor | None = None,
) -> RunClearResult:
    """Airflow's `POST .../dagRuns/{run_id}/clear` on `clear_task_instances`: `dry_run` (the
    default, as in Airflow) writes nothing and says which TIs would be cleared (or, with
    `only_new`, which tasks the Dag gained since the run was created); otherwise those TIs get a
    new try, or the new tasks get TIs, in the state `initial_ti_states` gives, the run is queued
    again, and `note` (when given) replaces the run's note; a paused Dag's run waits, queued,
    for the unpause (`sql/claims`), as Airflow's. Errors, nothing written: unknown run ->
    NotFound. Each write is its own durable transaction."""
    run = DagRun.objects.select_related("dag").filter(dag_id=dag_id, run_id=run_id).first()
    if run is None:
        raise exceptions.NotFound(
            f"The DagRun with dag_id: `{dag_id}` and run_id: `{run_id}` was not found",
            reason="dag_run_not_found",
        )
    tis = TaskInstance.objects.filter(dag_run=run).select_related("dag_run")
    if only_new:
        have = set(tis.values_list("task_id", flat=True))
        tasks = dict(
            Task.objects.filter(dag_id=dag_id)
            .exclude(task_id__in=have)
            .values_list("task_id", "retries")
        )
        planned, new_task_ids = [], sorted(tasks)
    else:
        planned = list(
            tis.filter(state__in=sorted(clearable_states(only_failed=only_failed))).order_by(
                "task_id", "map_index"
            )
        )
        new_task_ids = []
    if dry_run:
        return RunClearResult(run=run, task_instances=planned, new_task_ids=new_task_ids)
    if only_new:
        _add_new_task_instances(run, tasks, actor=actor)
    else:
        clear_task_instances(dag_run_id=run.pk, only_failed=only_failed, actor=actor)
    if note is not None:
        DagRun.objects.filter(pk=run.pk).update(note=note)
    run.refresh_from_db()
    cleared = list(tis.filter(pk__in=[ti.pk for ti in planned]).order_by("task_id", "map_index"))
    return RunClearResult(run=run, task_instances=cleared, new_task_ids=new_task_ids)


def _queue_run_again(run_pk: int, *, now: datetime) -> None:
    """The run reset of a clear, one UPDATE in the caller's transaction. Airflow: queued again
    now, started afresh (start and end cleared), its `clear_number` + 1."""
    DagRun.objects.filter(pk=run_pk).update(
        state=DagRunState.QUEUED,
        start_date=None,
        end_date=None,
        queued_at=now,
        clear_number=models.F("clear_number") + 1,
    )


def _add_new_task_instances(run: DagRun, tasks: dict[str, int], *, actor) -> None:
    """TIs for tasks the Dag gained after `run` was created, and the run queued again. Own
    durable transaction; a task whose TI appeared meanwhile is left alone (the unique
    (run, task, map index) constraint)."""
    if not tasks:
        return
    now = timezone.now()
    states = initial_ti_states(dag_id=run.dag_id, task_ids=sorted(tasks))
    # A new mapped task: its literal's map indexes, else its map-index -1 TI waiting (a root's
    # too), which the evaluation below expands (issue 25).
    mapped = {
        task.task_id: task
        for task in Task.objects.filter(dag_id=run.dag_id, task_id__in=list(tasks))
        if task.is_mapped
    }
    with transaction.atomic(durable=True):
        TaskInstance.objects.bulk_create(
            [
                TaskInstance(
                    dag_run=run,
                    dag_id=run.dag_id,
                    run_id=run.run_id,
                    task_id=task_id,
                    map_index=map_index,
                    try_number=first_try_number(state),
                    max_tries=retries,
                    state=state,
                    queued_at=now,
                )
                for task_id, retries in sorted(tasks.items())
                for map_index in (
                    range(mapped[task_id].map_length or 0) or range(-1, 0)
                    if task_id in mapped
                    else range(-1, 0)
                )
                for state in (
                    TIState.SCHEDULED if task_id in mapped and map_index == -1 else states[task_id],
                )
            ],
            ignore_conflicts=True,
        )
        _queue_run_again(run.pk, now=now)
        audit.record(
            actor=actor,
            action="dag_run.clear",
            summary=f"added {len(tasks)} new task instance(s) to run {run.run_id} of dag "
            f"{run.dag_id}",
            targets=[audit.Target(kind="dag_run", object_id=run.pk)],
            dag_id=run.dag_id,
            detail={"run_id": run.run_id, "only_new": True},
        )
    dependencies.evaluate(dag_run_id=run.pk, finished_task_ids=None)


# ---- issue 24: time schedules ----


def create_scheduled_runs(
    *,
    items: Sequence[tuple[DagRun, Sequence[NewTask]]],
    consumed_event_ids: Sequence[Sequence[int]] | None = None,
) -> None:
    """Insert unsaved runs of time schedules (built by `time_scheduling`) and their TIs, each
    with its Dag's tasks as `dag_tasks` reads them, as every run is created (`_insert_runs`);
    `consumed_event_ids` (parallel to `items`): the events each run consumes (an asset-and-time
    tick's), linked as an asset-triggered run's are. Inside the caller's transaction; 2
    statements whatever the number of runs and tasks, 3 with consumed events. A (Dag,
    logical_date) already taken raises IntegrityError (`dag_run_logical_date_unique`)."""
    consumed = consumed_event_ids or [() for _ in items]
    _insert_runs(
        [
            (run, list(dict.fromkeys(events)), tasks)
            for (run, tasks), events in zip(items, consumed, strict=True)
        ]
    )
