"""Dynamic task mapping (issue 25): a mapped task's TI of map index -1 becomes its map indexes.

A mapped task (`Task.map_length`, a literal list; `Task.map_upstream`, an upstream task's
return value) whose length is not known when its run is created has one TI of map index -1, as
in Airflow, waiting (`scheduled`) like any task with upstream tasks. When the dependency
evaluation (`dependencies.evaluate_round`) finds its trigger rule met, it expands it, as
Airflow 3.3.2's `TaskMap.expand_mapped_task` (airflow-core `models/taskmap.py`) does, called
from `DagRun._get_ready_tis` once the TI's dependencies are met. On PostgreSQL the evaluation
statement itself does it (`sql/dependencies._write_sql`: no statement more); on SQLite it
leaves the TI waiting and `expand` below does it, with the same rules:

- the length is the one the Task SDK pushed with the upstream's return value (`?mapped_length=`,
  `XCom.mapped_length`, Airflow's TaskMap.length), else the length of a list or object value
  (a worker that did not send one), or the literal's;
- over a mapped upstream (second order), as Airflow's `get_task_map_length`: the count of the
  return values its map indexes pushed (a map index that returned None, was skipped or failed
  pushed none), known once none of its TIs is unfinished (else nothing to map over);
- over several return values (issue 39: Airflow's `a.zip(b, ...)`, `a.concat(b, ...)`,
  `Task.map_combine`), each source's length as above, combined as Airflow's
  `get_task_map_length` does: nothing to map over if one has none, else the shortest's length
  (zip), the longest's (zip with a fillvalue) or their sum (concat);
- n >= 1: the TI becomes map index 0 and map indexes 1..n-1 are inserted, all queued (their
  trigger rule is the one just met);
- n = 0: the TI is skipped (Airflow: "Marking ... as SKIPPED since the map has 0 values");
- no value pushed (or one that is neither a list nor an object): upstream_failed (Airflow's
  NotFullyPopulated, `unmapped_ti.state = UPSTREAM_FAILED`).

A mapped task group (`Task.map_group`) over a return value expands as one: when its roots
expand, the group's other tasks (downstream of another in it) get the same map indexes, left
waiting (`scheduled`) for their own map index of upstream (`sql/dependencies._write_sql`,
where the PostgreSQL statement does the same).

`expand`: four statements whatever n (the run, the lengths, one UPDATE of the -1 TIs, one
INSERT of the others); one more when a task expands over several return values (their lengths),
two more when a group spreads (its waiting -1 TIs, their UPDATE).
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest

from ..models import DagRun, MapCombine, Task, TaskInstance, TaskUpstream, TIState, XCom
from ..models.runs import TI_UNFINISHED_STATES, first_try_number
from ..sql.dependencies import RETURN_VALUE_KEY


def _length(
    *, literal: int | None, pushed: int | None, value: object, has_value: bool
) -> int | None:
    if literal is not None:
        return literal
    if pushed is not None:
        return pushed
    if has_value and isinstance(value, list | dict):
        return len(value)
    return None


def _combined(combine: str, lengths: Sequence[int | None]) -> int | None:
    """Airflow's `get_task_map_length` of a zip or concat: nothing if one source gives
    nothing, else the shortest's length, the longest's (a fillvalue) or their sum."""
    if not lengths or any(length is None for length in lengths):
        return None
    known = [length for length in lengths if length is not None]
    if combine == MapCombine.ZIP:
        return min(known)
    if combine == MapCombine.ZIP_LONGEST:
        return max(known)
    return sum(known)


def _length_annotations(*, dag_run_id: int, dag_id: str, run_id: str, of: str) -> dict[str, Any]:
    """What the length of the return value of the task named by the column `of` needs, in the
    run (`_source_length`'s arguments), as annotations of a Task query."""
    pushed = XCom.objects.filter(
        dag_id=dag_id, run_id=run_id, task_id=OuterRef(of), map_index=-1, key=RETURN_VALUE_KEY
    )
    mapped_source = Task.objects.filter(dag_id=dag_id, task_id=OuterRef(of)).filter(
        Q(map_length__isnull=False) | ~Q(map_upstream="")
    )
    unfinished = TaskInstance.objects.filter(
        dag_run_id=dag_run_id, task_id=OuterRef(of), state__in=TI_UNFINISHED_STATES
    )
    pushed_by_map_indexes = (
        XCom.objects.filter(
            dag_id=dag_id,
            run_id=run_id,
            task_id=OuterRef(of),
            map_index__gte=0,
            key=RETURN_VALUE_KEY,
        )
        .order_by()
        .values("task_id")
        .annotate(n=Count("id"))
        .values("n")
    )
    return {
        "pushed_length": Subquery(pushed.values("mapped_length")[:1]),
        "pushed_value": Subquery(pushed.values("value")[:1]),
        "pushed_id": Subquery(pushed.values("id")[:1]),
        "source_mapped": Exists(mapped_source),
        # Of a mapped task (second order): nothing to map over while one of its TIs is
        # unfinished, else the count of its map indexes' return values.
        "pushed_count": Case(
            When(Exists(unfinished), then=Value(None)),
            default=Coalesce(Subquery(pushed_by_map_indexes), Value(0)),
            output_field=IntegerField(),
        ),
    }


LENGTH_COLUMNS = ("pushed_length", "pushed_value", "pushed_id", "source_mapped", "pushed_count")


def _source_length(
    pushed: int | None, value: object, xcom_id: object, mapped: bool, count: int | None
) -> int | None:
    """The length a return value gives (`LENGTH_COLUMNS`), as
    `sql/dependencies._source_length_sql`: of an unmapped task, the pushed length or its value's;
    of a mapped one, None while one of its TIs is unfinished, else its pushed values' count."""
    if mapped:
        return count
    return _length(literal=None, pushed=pushed, value=value, has_value=xcom_id is not None)


def expand(*, dag_run_id: int, task_ids: Sequence[str], now: datetime) -> list[tuple[str, str]]:
    """Expand the waiting map-index -1 TIs of `task_ids` in the run, whose trigger rule is met
    (see the module docstring). Inside the caller's transaction; a TI expanded meanwhile is
    left alone (the UPDATE matches only a waiting -1 TI, the INSERT ignores map indexes that
    exist). Returns (task_id, new state) per task: queued (expanded), skipped or
    upstream_failed."""
    dag_id, run_id = DagRun.objects.values_list("dag_id", "run_id").get(pk=dag_run_id)

    def lengths_of(column: str) -> dict[str, Any]:
        return _length_annotations(dag_run_id=dag_run_id, dag_id=dag_id, run_id=run_id, of=column)

    # The tasks to expand, and the other tasks of their mapped groups (spread below).
    groups = Task.objects.filter(dag_id=dag_id, task_id__in=list(task_ids)).exclude(map_group="")
    in_group_upstream = TaskUpstream.objects.filter(
        task=OuterRef("pk"), upstream__map_group=OuterRef("map_group")
    )
    rows = list(
        Task.objects.filter(dag_id=dag_id)
        .filter(
            Q(task_id__in=list(task_ids))
            | Q(Exists(in_group_upstream), map_group__in=groups.values("map_group"))
        )
        .annotate(**lengths_of("map_upstream"))
        .values_list(
            "task_id",
            "retries",
            "map_length",
            "map_combine",
            "map_sources",
            "map_group",
            *LENGTH_COLUMNS,
        )
    )
    # Over several return values (zip, concat): each one's length, one statement more.
    combined = {source for row in rows if row[3] for source in row[4]}
    sources = (
        {
            task_id: _source_length(*columns)
            for task_id, *columns in Task.objects.filter(dag_id=dag_id, task_id__in=combined)
            .annotate(**lengths_of("task_id"))
            .values_list("task_id", *LENGTH_COLUMNS)
        }
        if combined
        else {}
    )
    lengths: dict[str, int | None] = {}
    retries: dict[str, int] = {}
    group_of: dict[str, str] = {}
    for task_id, task_retries, literal, combine, of, group, *columns in rows:
        retries[task_id] = task_retries
        group_of[task_id] = group
        lengths[task_id] = (
            literal
            if literal is not None
            else _combined(combine, [sources.get(source) for source in of])
            if combine
            else _source_length(*columns)
        )
    members = {task_id for task_id in group_of if task_id not in task_ids}
    lengths_of_members = {task_id: lengths.pop(task_id) for task_id in members}
    outcome = {
        task_id: (
            TIState.UPSTREAM_FAILED
            if length is None
            else TIState.SKIPPED
            if length == 0
            else TIState.QUEUED
        )
        for task_id, length in lengths.items()
    }
    if not outcome:
        return []
    expanded = [task_id for task_id, state in outcome.items() if state == TIState.QUEUED]
    finished = [task_id for task_id, state in outcome.items() if state != TIState.QUEUED]
    TaskInstance.objects.filter(
        dag_run_id=dag_run_id,
        task_id__in=list(outcome),
        map_index=-1,
        state=TIState.SCHEDULED,
    ).update(
        state=Case(*(When(task_id=t, then=Value(s)) for t, s in outcome.items())),
        map_index=Case(When(task_id__in=expanded, then=Value(0)), default=F("map_index")),
        # Queued: its first try (a cleared TI keeps the one its clear gave it).
        try_number=Case(
            When(task_id__in=expanded, then=Greatest(F("try_number"), Value(1))),
            default=F("try_number"),
        ),
        queued_at=Case(When(task_id__in=expanded, then=Value(now)), default=F("queued_at")),
        end_date=Case(When(task_id__in=finished, then=Value(now)), default=F("end_date")),
        updated_at=now,
    )

    def copies(
        task_ids: Iterable[str], length: Mapping[str, int | None], state: str
    ) -> Iterator[TaskInstance]:
        """Map indexes 1..n-1 of each task, first tries (try 0 while they wait)."""
        return (
            TaskInstance(
                dag_run_id=dag_run_id,
                dag_id=dag_id,
                run_id=run_id,
                task_id=task_id,
                map_index=map_index,
                try_number=first_try_number(state),
                max_tries=retries[task_id],
                state=state,
                queued_at=now,
            )
            for task_id in task_ids
            for map_index in range(1, length[task_id] or 0)
        )

    new = list(copies(expanded, lengths, TIState.QUEUED))
    spread = {
        task_id: length
        for task_id, length in lengths_of_members.items()
        if length and any(group_of[t] == group_of[task_id] for t in expanded)
    }
    if spread:
        # The other tasks of an expanded group: the same map indexes, waiting for theirs
        # upstream in the group (`sql/dependencies._write_sql`). Only a -1 TI still waiting is
        # renumbered; SQLite runs one writer at a time, so no racing evaluation inserts them.
        waiting = TaskInstance.objects.filter(
            dag_run_id=dag_run_id,
            task_id__in=list(spread),
            map_index=-1,
            state=TIState.SCHEDULED,
        )
        renumbered = list(waiting.values_list("task_id", flat=True))
        waiting.update(map_index=0, updated_at=now)
        new.extend(copies(renumbered, spread, TIState.SCHEDULED))
    if new:
        TaskInstance.objects.bulk_create(new, ignore_conflicts=True)
    return sorted(outcome.items())
