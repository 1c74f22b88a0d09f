"""Dag runs, their task instances, the events each run consumed and the events it produced."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, Prefetch, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from ..catalog import run_reads, task_graph, task_order
from ..models import (
    AssetAliasEvent,
    AssetEvent,
    AssetEventQueue,
    AuditTarget,
    Dag,
    DagRun,
    DagRunAssetEvent,
    TaskInstance,
    TaskLogChunk,
    TIState,
    Trigger,
)
from ..runtime import logs as task_logs
from ..scheduling import runs
from ..sql import task_instances as task_instances_sql
from . import log_view
from . import task_graph as task_graph_view
from .base import (
    EstimatedCountMixin,
    LinkTableAdmin,
    ReadOnlyAdmin,
    UuidSearchMixin,
    actor_of,
    admin_link,
    changelist_url,
    count_of,
    dag_id_filter,
    duration,
    pretty_json,
    run_duration,
    state_badge,
    state_colour,
)

CONSUMED_SHOWN = 200
PRODUCED_SHOWN = 500
GRID_RUNS = 25
# The grid's run counts to choose from (`?runs=`; another value is the default).
GRID_RUN_CHOICES = (10, 25, 50, 100)
GRID_BAR_MIN, GRID_BAR_MAX = 4, 48  # px: a run's bar in the grid's header, by its duration
FAILED_SHOWN = 10
# The run page's TI table lists this many TIs, in task order; the TI list filtered on the run
# has them all (1,000 rows were 1.7 s of a 2.1 s page).
TI_TABLE_SHOWN = 100
FAILED_LINES = 20


@dataclass
class TIOutput:
    """What became of one TI's outlets: events registered, its outbox row, a deletion."""

    ti: TaskInstance
    duration: str
    events: list[AssetEvent] = field(default_factory=list)
    row: AssetEventQueue | None = None
    row_status: str = ""
    deleted_by: str = ""
    deleted_at: datetime | None = None

    @property
    def lost(self) -> bool:
        return self.row_status == "parked" or bool(self.deleted_by)


def _row_status(row: AssetEventQueue, *, now: datetime) -> str:
    if row.parked_at is not None:
        return "parked"
    if row.next_attempt_at > now and row.attempts:
        return "backing off"
    return "pending"


def run_outputs(run: DagRun, *, shape: task_graph.Shape | None = None) -> list[TIOutput]:
    """Per TI of the run, in the Dag's task order (`task_order`, tasks gone from the
    definition last): its events, its outbox row (pending / backing off / parked) and who
    deleted its row, if anyone did. Seven queries whatever the number of TIs and events; four
    when the caller has read the Dag's `shape` (`task_graph.load`)."""
    now = timezone.now()
    rows = shape.rows() if shape is not None else task_order.dag_task_rows(dag_id=run.dag_id)
    rank = {row.task_id: i for i, row in enumerate(rows) if row.task_id is not None}
    tis = sorted(
        run.task_instances.all(),
        key=lambda ti: (rank.get(ti.task_id, len(rank)), ti.task_id, ti.map_index),
    )
    outputs = {
        ti.id: TIOutput(ti=ti, duration=run_duration(ti.start_date, ti.end_date, now=now))
        for ti in tis
    }
    events = (
        AssetEvent.objects.filter(source_dag_id=run.dag_id, source_run_id=run.run_id)
        .select_related("asset")
        .order_by("id")[:PRODUCED_SHOWN]
    )
    for event in events:
        if event.source_ti_id in outputs:
            outputs[event.source_ti_id].events.append(event)
    for row in AssetEventQueue.objects.filter(ti_id__in=list(outputs)).order_by("try_number"):
        output = outputs[row.ti_id]
        output.row, output.row_status = row, _row_status(row, now=now)
    deletions = (
        AuditTarget.objects.filter(
            kind="outbox_row", ti_id__in=list(outputs), entry__action="outbox.delete"
        )
        .select_related("entry")
        .order_by("entry__at")
    )
    for target in deletions:
        output = outputs[UUID(str(target.ti_id))]
        output.deleted_by, output.deleted_at = target.entry.actor_name, target.entry.at
    return list(outputs.values())


@dataclass
class FailedExcerpt:
    """A failed TI of a run: the last lines of its current try's log and its error."""

    ti: TaskInstance
    lines: str  # the rendered last records (log_view)
    error: str  # the last record's exception as a traceback, or its message


def failed_excerpts(outputs: list[TIOutput]) -> list[FailedExcerpt]:
    """The run's failed TIs (the first FAILED_SHOWN), each with the last FAILED_LINES records
    of its current try's log and the error of its last error record. One query whatever the
    number of TIs and the size of their logs; none when no TI failed."""
    failed = [o.ti for o in outputs if o.ti.state == TIState.FAILED][:FAILED_SHOWN]
    if not failed:
        return []
    wanted = Q()
    for ti in failed:
        wanted |= Q(ti_id=ti.id, try_number=ti.try_number)
    texts: dict[UUID, list[str]] = {}
    for ti_id, content in (
        TaskLogChunk.objects.filter(wanted)
        .order_by("ti_id", "offset")
        .values_list("ti_id", "content")
    ):
        texts.setdefault(ti_id, []).append(content)
    excerpts = []
    for ti in failed:
        records = task_logs.structured("".join(texts.get(ti.id, [])))
        errors = [r for r in records if str(r.get("level", "")).lower() in ("error", "critical")]
        error = ""
        if errors:
            last = errors[-1]
            detail = last.get("error_detail")
            error = log_view.traceback_text(detail) if detail else log_view.record_line(last)
        excerpts.append(
            FailedExcerpt(ti=ti, lines=log_view.render(records[-FAILED_LINES:]), error=error)
        )
    return excerpts


def run_grid(*, dag: Dag, runs: int = GRID_RUNS) -> dict:
    """The Dag's last `runs` runs (oldest left) x its tasks, each cell a TI's state, try and
    duration. Runs are ordered as Airflow's grid orders them: by logical date, a run without
    one (asset-triggered) by its `run_after`, so a catchup's runs and a Dag's asset runs fall
    in time order whatever order they were created in. Tasks in Airflow's grid order
    (`task_order`: topological, in their groups, a group's header row before its tasks). Four
    queries whatever the number of runs, tasks and TIs; tasks that are gone from the
    definition but have TIs in these runs are listed last."""
    now = timezone.now()
    recent: list[dict[str, Any]] = [
        {**run, "duration": run_duration(run["start_date"], run["end_date"], now=now)}
        for run in DagRun.objects.filter(dag=dag)
        .annotate(run_date=Coalesce("logical_date", "run_after"))
        .order_by("-run_date", "-id")
        .values(
            "id",
            "run_id",
            "run_type",
            "state",
            "run_after",
            "logical_date",
            "start_date",
            "end_date",
        )[:runs]
    ][::-1]
    # Airflow's grid: each run's bar as tall as its duration against the longest shown, and a
    # label under it (its logical date, else when it was due; the run id on hover).
    seconds = [
        ((r["end_date"] or now) - r["start_date"]).total_seconds() if r["start_date"] else 0.0
        for r in recent
    ]
    longest = max(seconds, default=0.0) or 1.0
    for run, took in zip(recent, seconds, strict=True):
        run["bar"] = round(GRID_BAR_MIN + (GRID_BAR_MAX - GRID_BAR_MIN) * took / longest)
        run["label"] = timezone.localtime(run["logical_date"] or run["run_after"]).strftime(
            "%m-%d %H:%M"
        )
    ordered = task_order.dag_task_rows(dag_id=dag.dag_id, task_groups=dag.task_groups)
    task_ids = [row.task_id for row in ordered if row.task_id is not None]
    # The database writes each TI's cell text after its state letter and, for a
    # map index only, its epoch milliseconds (a mapped task's span): no timestamp or duration
    # is built in Python (200,000 and 100,000 of them at 1,000 tasks x 100 runs).
    column = {run["id"]: i for i, run in enumerate(recent)}
    cells: dict[str, list] = {}
    multi: dict[tuple[str, int], list[tuple]] = {}  # a mapped task's map indexes
    mapped: set[str] = set()
    sql = task_instances_sql.grid_cell_annotations()
    for run_pk, task_id, map_index, state, text, start_ms, end_ms in (
        TaskInstance.objects.filter(dag_run_id__in=list(column))
        .annotate(text=sql["text"], start_ms=sql["start_ms"], end_ms=sql["end_ms"])
        .values_list("dag_run_id", "task_id", "map_index", "state", "text", "start_ms", "end_ms")
    ):
        by_run = cells.get(task_id)
        if by_run is None:
            by_run = cells[task_id] = [None] * len(recent)
        at = column[run_pk]
        ti = (map_index, state, text, start_ms, end_ms)
        if map_index >= 0:
            mapped.add(task_id)
        if by_run[at] is None:
            by_run[at] = ti
        else:
            mapped.add(task_id)
            multi.setdefault((task_id, at), [by_run[at]]).append(ti)
    gone = sorted(set(cells) - set(task_ids))
    letters: dict[str | None, str] = {}
    rows = []
    gone_rows = [task_order.Row(label=task_id, depth=0, task_id=task_id) for task_id in gone]
    empty: list = [None] * len(recent)
    for line in [*ordered, *gone_rows]:
        if line.task_id is None:
            rows.append({"group_id": line.group_id, "label": line.label, "depth": line.depth})
            continue
        task_id = line.task_id
        found = cells.get(task_id) or empty
        row: dict[str, Any] = {
            "task_id": task_id,
            "label": line.label,
            "depth": line.depth,
            "gone": task_id in gone,
            "cells": None,
        }
        if task_id in mapped:
            # A mapped task: its cells are drawn here (`_mapped_cell`), few as they are.
            row["cells"] = mark_safe(
                "".join(
                    _mapped_cell(task_id, multi.get((task_id, at), [ti]), run)
                    if ti
                    else _EMPTY_CELL
                    for at, (ti, run) in enumerate(zip(found, recent, strict=True))
                )
            )
            rows.append(row)
            continue
        tokens = []
        for ti in found:
            if ti is None:
                tokens.append("-")
                continue
            letter = letters.get(ti[1])
            if letter is None:
                letter = letters[ti[1]] = _state_letter(len(letters))
            tokens.append(letter + ti[2])
        row["data"] = " ".join(tokens)
        rows.append(row)
    ti_url = reverse("admin:assets_app_dagrun_ti", args=[987654321, "__task__"]).replace(
        "987654321", "__run__"
    )
    return {
        "dag": dag,
        "runs": recent,
        "rows": rows,
        # What the page's script needs to draw the compact rows' cells (`grid_cell_annotations`).
        "cell_data": {
            "states": [[state or "", state_colour(state)] for state in letters],
            "runs": [[run["id"], run["run_id"]] for run in recent],
            "ti_url": ti_url,
        },
    }


_CODES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

# One plain TI's cell in a compact row, after its state's letter (`_state_letter`, states in
# first-seen order): its duration in ms (none before it started), `+` while unfinished ("so
# far"), `~` and its try when not the first. `-` is a run without this task's TI. The page's
# script draws the cell, its colour, its link (`ti_redirect_view`) and its title from it.


def _state_letter(code: int) -> str:
    return _CODES[code] if code < len(_CODES) else f"({code})"


_EMPTY_CELL = '<td><span class="aes-cell aes-cell-empty" title="no task instance"></span></td>'


def _mapped_cell(task_id: str, tis: list[tuple], run: dict) -> str:
    """A mapped task's cell: coloured by Airflow's summary state of its map indexes, with
    their count and the counts by state; it opens the run's page, which lists them all. Its
    duration: from the first map index's start to the last one's end."""
    tis = sorted(tis, key=lambda ti: ti[0])
    states = [ti[1] for ti in tis]
    state = run_reads.mapped_state(states)
    counts = ", ".join(f"{n} {s}" for s, n in run_reads.state_counts(states))
    starts = [ti[3] for ti in tis if ti[3] is not None]
    if starts:
        ends = [ti[4] for ti in tis if ti[4] is not None]
        took = duration(timedelta(milliseconds=max(ends) - min(starts)))
        # Unfinished while a map index runs ("+") or has not started (no duration).
        if any(not ti[2] or ti[2][0] == "~" or "+" in ti[2] for ti in tis):
            took += " so far"
    else:
        took = "-"
    return format_html(
        '<td><a href="{}#run-task-instances" title="{} ({} mapped) · {} · {} · {}"><span '
        'class="aes-cell aes-cell-mapped" data-state="{}" data-mapped="{}" '
        'style="background:{}">{}</span></a></td>',
        reverse("admin:assets_app_dagrun_change", args=[run["id"]]),
        task_id,
        len(tis),
        counts,
        took,
        run["run_id"],
        state or "",
        len(tis),
        state_colour(state),
        len(tis),
    )


@admin.register(DagRun)
class DagRunAdmin(EstimatedCountMixin, admin.ModelAdmin):
    """Runs are written by the scheduler and the manual trigger; operators look and may delete."""

    list_display = (
        "run_label",
        "dag",
        "state_view",
        "run_after",
        "run_time",
        "consumed_event_count",
        "ti_summary",
        "outputs_status",
    )
    list_filter = ("run_type", "state", "dag")
    list_select_related = ("dag",)
    search_fields = ("run_id", "dag__dag_id")
    date_hierarchy = "run_after"
    readonly_fields = (
        "outputs_warning",
        "state_view",
        "run_time",
        "conf_json",
        "task_instances_table",
        "consumed_events_table",
        "task_graph",
    )
    fieldsets = (
        (None, {"fields": ("outputs_warning",), "classes": ("aes-wide", "aes-bare")}),
        (
            None,
            {
                "fields": (
                    "dag",
                    "run_id",
                    "run_type",
                    "state_view",
                    "run_after",
                    "logical_date",
                    "start_date",
                    "end_date",
                    "run_time",
                    "triggering_user_name",
                    "note",
                    "conf_json",
                )
            },
        ),
        ("Graph", {"fields": ("task_graph",), "classes": ("aes-wide",)}),
        (
            "Task instances and the events they produced",
            {"fields": ("task_instances_table",), "classes": ("aes-wide",)},
        ),
        ("Consumed events", {"fields": ("consumed_events_table",), "classes": ("aes-wide",)}),
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                consumed_event_count=count_of(DagRunAssetEvent, "dag_run"),
                ti_total=count_of(TaskInstance, "dag_run"),
                ti_done=count_of(TaskInstance, "dag_run", state=TIState.SUCCESS),
                outputs_parked=_outbox_count(parked_at__isnull=False),
                outputs_pending=_outbox_count(parked_at__isnull=True),
            )
        )

    def has_clear_permission(self, request):
        return request.user.has_perm("assets_app.change_taskinstance")

    def get_urls(self):
        clear = self.admin_site.admin_view(self.clear_view)
        ti = self.admin_site.admin_view(self.ti_redirect_view)
        return [
            path("<int:object_id>/ti/<path:task_id>/", ti, name="assets_app_dagrun_ti"),
            path("<path:object_id>/clear/", clear, name="assets_app_dagrun_clear"),
            *super().get_urls(),
        ]

    def ti_redirect_view(self, request, object_id, task_id):
        """A grid cell's link (the grid names a cell by its run and task, not by the TI's id:
        100,000 ids were 3.6 MB of page): to the TI's page, or to the run's TI table when the
        task is mapped (its map indexes are listed there). One query."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        ti = (
            TaskInstance.objects.filter(dag_run_id=object_id, task_id=task_id)
            .order_by("-map_index")
            .values_list("id", "map_index")
            .first()
        )
        if ti is None:
            raise Http404("No such task instance.")
        if ti[1] >= 0:
            url = reverse("admin:assets_app_dagrun_change", args=[object_id])
            return HttpResponseRedirect(f"{url}#run-task-instances")
        return HttpResponseRedirect(reverse("admin:assets_app_taskinstance_change", args=[ti[0]]))

    def clear_view(self, request, object_id):
        """POST: clear the run's finished TIs, only its failed ones (`only_failed`), or one TI
        (`ti_id`), through `runs.clear_task_instances` (audited); back to the run page."""
        if request.method != "POST" or not self.has_clear_permission(request):
            raise PermissionDenied
        run = get_object_or_404(DagRun, pk=object_id)
        ti_id = request.POST.get("ti_id") or None
        result = runs.clear_task_instances(
            dag_run_id=run.pk,
            ti_ids=[ti_id] if ti_id else None,
            only_failed=request.POST.get("only_failed") == "1",
            actor=actor_of(request),
        )
        if result.cleared:
            self.message_user(
                request,
                f"Cleared {len(result.cleared)} task instance(s): {', '.join(result.cleared)}; "
                "they are queued for a new try.",
            )
        if result.skipped:
            self.message_user(
                request,
                f"Left alone (queued, running, or held by a worker right now): "
                f"{', '.join(result.skipped)}.",
                messages.WARNING,
            )
        return HttpResponseRedirect(reverse("admin:assets_app_dagrun_change", args=[run.pk]))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "can_clear": self.has_clear_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context)

    def get_object(self, request, object_id, from_field=None):
        # The change page's outputs are computed once and shared by its two fields.
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            # The Dag's shape orders the TIs and draws the graph (`task_graph`).
            obj.shape = task_graph.load(dag_id=obj.dag_id, task_groups=obj.dag.task_groups)
            obj.outputs = run_outputs(obj, shape=obj.shape)
            # The TI table's clear buttons need the CSRF token and the permission.
            obj.request, obj.can_clear = request, self.has_clear_permission(request)
        return obj

    @admin.display(description="state", ordering="state")
    def state_view(self, obj):
        return state_badge(obj.state)

    @admin.display(description="run", ordering="run_id")
    def run_label(self, obj):
        return format_html(
            '{}<br><span class="aes-muted">{}</span>', obj.run_id, obj.get_run_type_display()
        )

    @admin.display(description="took")
    def run_time(self, obj):
        return run_duration(obj.start_date, obj.end_date, now=timezone.now())

    @admin.display(description="outputs")
    def outputs_status(self, obj):
        if obj.outputs_parked:
            return format_html(
                '<span class="aes-badge aes-badge-parked">{} parked</span>', obj.outputs_parked
            )
        if obj.outputs_pending:
            return format_html(
                '<span class="aes-badge aes-badge-due">{} pending</span>', obj.outputs_pending
            )
        return "-"

    @admin.display(description="")
    def outputs_warning(self, obj):
        """Above the fields: a failed run's failed TIs with their last log lines and error
        (`failed_excerpts`), then the outputs that never arrived. "No output was lost" is said
        of a run that did not fail only."""
        excerpts = failed_excerpts(obj.outputs) if obj.state == "failed" else []
        failed = render_to_string(
            "admin/assets_app/run_failed_excerpts.html",
            {"excerpts": excerpts, "run": obj, "shown": FAILED_SHOWN},
        )
        lost = [o for o in obj.outputs if o.lost]
        if lost:
            return mark_safe(
                failed
                + render_to_string("admin/assets_app/run_outputs_warning.html", {"lost": lost})
            )
        waiting = sum(1 for o in obj.outputs if o.row is not None)
        if waiting:
            text = f"{waiting} outbox row(s) of this run are waiting to be registered."
        elif obj.state == "failed":
            return mark_safe(failed)
        else:
            text = "No output of this run was lost."
        return mark_safe(failed + format_html('<span class="aes-muted">{}</span>', text))

    @admin.display(description="task instances")
    def task_instances_table(self, obj):
        """The run's TIs in task order, the first TI_TABLE_SHOWN of them, with a link to the TI
        list filtered on the run when there are more (the graph above shows every state)."""
        shown = obj.outputs[:TI_TABLE_SHOWN]
        return render_to_string(
            "admin/assets_app/run_task_instances.html",
            {
                "outputs": shown,
                "total": len(obj.outputs),
                "more": len(obj.outputs) - len(shown),
                "all_url": changelist_url(TaskInstance, dag_run__id__exact=obj.pk),
                "run": obj,
                "can_clear": getattr(obj, "can_clear", False),
            },
            request=getattr(obj, "request", None),
        )

    @admin.display(description="")
    def task_graph(self, obj):
        """The Dag's graph coloured by this run's states (`task_graph`), from the shape and
        the TIs the page has read (`get_object`, `run_outputs`): no query of its own."""
        return task_graph_view.render(
            shape=obj.shape,
            request=getattr(obj, "request", None),
            tis=[(o.ti.task_id, o.ti.state, o.ti.id) for o in obj.outputs],
            run_pk=obj.pk,
        )

    @admin.display(description="consumed", ordering="consumed_event_count")
    def consumed_event_count(self, obj):
        return obj.consumed_event_count

    @admin.display(description="tasks done")
    def ti_summary(self, obj):
        return f"{obj.ti_done} / {obj.ti_total}"

    @admin.display(description="conf")
    def conf_json(self, obj):
        return pretty_json(obj.conf)

    @admin.display(description="consumed events")
    def consumed_events_table(self, obj):
        links = (
            obj.consumed_links.select_related("asset_event__asset")
            .prefetch_related(
                Prefetch(
                    "asset_event__alias_links",
                    queryset=AssetAliasEvent.objects.select_related("alias"),
                )
            )
            .order_by("asset_event_id")[:CONSUMED_SHOWN]
        )
        return render_to_string(
            "admin/assets_app/recent_events.html",
            {"events": [link.asset_event for link in links], "hide_consumers": True},
        )


def _outbox_count(**filters):
    """Outbox rows of the outer run's TIs (by source dag and run id), a correlated COUNT."""
    counted = (
        AssetEventQueue.objects.filter(
            source_dag_id=OuterRef("dag_id"), source_run_id=OuterRef("run_id"), **filters
        )
        .order_by()
        .values("source_dag_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


@admin.register(TaskInstance)
class TaskInstanceAdmin(EstimatedCountMixin, UuidSearchMixin, admin.ModelAdmin):
    """TIs change only through the worker API (task_state owns their lock): view and delete.
    A TI id in the search box finds that TI by its primary key (UuidSearchMixin)."""

    list_display = (
        "task_label",
        "run_label",
        "try_label",
        "state_view",
        "hostname",
        "started",
        "took",
    )
    list_filter = ("state", dag_id_filter("dag_id", "dag id"))
    search_fields = ("dag_id", "task_id", "run_id", "hostname")
    search_help_text = "a TI id (exact), or part of a Dag id, task id, run id or hostname"
    readonly_fields = ("dag_run_link", "deferral", "outbox_rows", "task_log")

    @admin.display(description="deferral")
    def deferral(self, obj):
        """A deferred TI's trigger (issue 42): its class, who runs it until when, its timeout,
        and the method the task resumes in; after a resume, the method it resumes in."""
        if obj.trigger_id is None:
            if obj.next_method:
                return format_html("resumes in <code>{}</code>", obj.next_method)
            return "-"
        trigger = obj.trigger
        holder = (
            format_html("run by {} (lease until {})", trigger.claimed_by, trigger.lease_until)
            if trigger.claimed_by
            else "waiting for a triggerer"
        )
        return format_html(
            "trigger {} <code>{}</code><br>{}<br>times out: {}<br>resumes in <code>{}</code>",
            trigger.id,
            trigger.classpath,
            holder,
            obj.trigger_timeout or "never",
            obj.next_method,
        )

    def get_fieldsets(self, request, obj=None):
        # The log first, as Airflow's TI page opens on it; the fields under it.
        fields = [f for f in self.get_fields(request, obj) if f != "task_log"]
        return [
            ("Log", {"fields": ("task_log",), "classes": ("aes-wide",)}),
            (None, {"fields": fields}),
        ]

    @admin.display(description="log")
    def task_log(self, obj):
        """Every try's log as the worker shipped it (task_logs), one tab per try, the current
        one open, rendered as Airflow's log view prints it (`log_view`); while the TI runs the
        page reloads itself every 2 s, so the log grows live. One query for all tries."""
        logs = task_logs.read_tries(ti_ids=[obj.id], up_to=obj.try_number)
        tries = list(range(1, max(obj.try_number, 1) + 1))
        return render_to_string(
            "admin/assets_app/task_log.html",
            {
                "tries": [
                    {
                        "number": n,
                        "current": n == tries[-1],
                        "bytes": len(logs.get((obj.id, n), "").encode()),
                        "html": log_view.render(task_logs.structured(logs.get((obj.id, n), ""))),
                    }
                    for n in tries
                ],
                "live": obj.state == "running",
            },
        )

    @admin.display(description="state", ordering="state")
    def state_view(self, obj):
        return state_badge(obj.state)

    @admin.display(description="task instance", ordering="dag_id")
    def task_label(self, obj):
        label = f"{obj.dag_id}.{obj.task_id}"
        if obj.map_index >= 0:
            label += f"[{obj.map_index}]"
        return format_html('{}<br><span class="aes-muted">{}</span>', label, str(obj.id)[:8])

    @admin.display(description="run", ordering="run_id")
    def run_label(self, obj):
        return obj.run_id

    @admin.display(description="try", ordering="try_number")
    def try_label(self, obj):
        return obj.try_number

    @admin.display(description="started", ordering="start_date")
    def started(self, obj):
        return obj.start_date

    @admin.display(description="took")
    def took(self, obj):
        return run_duration(obj.start_date, obj.end_date, now=timezone.now())

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="dag run")
    def dag_run_link(self, obj):
        return admin_link(obj.dag_run)

    @admin.display(description="outbox rows")
    def outbox_rows(self, obj):
        rows = AssetEventQueue.objects.filter(ti_id=obj.id).aggregate(
            n=Count("id"), parked=Count("id", filter=Q(parked_at__isnull=False))
        )
        if not rows["n"]:
            return "none (outlets registered, or the task had none)"
        url = changelist_url(AssetEventQueue, ti_id=str(obj.id))
        return format_html('<a href="{}">{} row(s), {} parked</a>', url, rows["n"], rows["parked"])


@admin.register(DagRunAssetEvent)
class DagRunAssetEventAdmin(LinkTableAdmin):
    list_display = ("dag_run", "dag", "asset_event", "asset_name")
    list_select_related = ("dag_run", "dag", "asset_event__asset")
    list_filter = ("dag",)
    search_fields = ("dag_run__run_id", "dag__dag_id", "asset_event__asset__name")

    @admin.display(description="asset")
    def asset_name(self, obj):
        return obj.asset_event.asset.name


@admin.register(TaskLogChunk)
class TaskLogChunkAdmin(EstimatedCountMixin, UuidSearchMixin, LinkTableAdmin):
    """The shipped pieces of the workers' task logs: read on the TI's page (the log section), here
    only by URL, for an operator checking what a worker sent."""

    list_display = ("ti_id", "try_number", "offset", "size", "created_at")
    list_filter = ("try_number",)
    search_fields = ("=ti__id",)
    search_help_text = "a TI id (exact)"
    uuid_search_field = "ti_id"
    uuid_search_only = True
    date_hierarchy = "created_at"


@admin.register(Trigger)
class TriggerAdmin(ReadOnlyAdmin):
    """The triggers of deferred TIs (issue 42): which TI waits for each, and which triggerer
    runs it until when. A trigger whose TI resumed waits here until the trigger timer deletes
    it."""

    list_display = ("id", "classpath", "waiting_ti", "claimed_by", "lease_until", "created_at")
    search_fields = ("=id", "classpath", "claimed_by")
    show_full_result_count = False

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("task_instances")

    @admin.display(description="waiting task instance")
    def waiting_ti(self, obj):
        tis = [ti for ti in obj.task_instances.all() if ti.state == TIState.DEFERRED]
        if not tis:
            return "none (resumed)"
        return admin_link(tis[0])
