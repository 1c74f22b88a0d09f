"""Dags and tasks: schedule (with what is already satisfied), queued events with "clear", runs."""

import inspect
import json
from typing import Any
from urllib.parse import quote_plus

from django.contrib import admin
from django.contrib.admin.utils import display_for_value, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Case, Count, Max, Min, OuterRef, Prefetch, Subquery, Value, When
from django.http import Http404, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from ..catalog import dags, queued_events, task_graph, task_order
from ..definitions import conditions, param_form, sources, timetables
from ..definitions import params as dag_params
from ..guards import exceptions, limits
from ..models import (
    AssetAliasAsset,
    AssetDagRunQueue,
    Dag,
    DagCode,
    DagFavorite,
    DagImportError,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    ScheduleMode,
    Task,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskSetupLink,
    TaskUpstream,
    TIState,
    WorkerBundle,
)
from ..operations import bundles
from ..scheduling import runs
from . import task_graph as task_graph_view
from .base import (
    STATE_COLOURS,
    LinkTableAdmin,
    ReadOnlyAdmin,
    actor_of,
    count_of,
    duration,
    pretty_json,
    state_badge,
)
from .runs import GRID_RUN_CHOICES, GRID_RUNS, run_grid

RECENT_RUNS = 15
QUEUED_ROWS_SHOWN = 200
# A schedule over 100,000 assets is legal; its page shows this much of it and links to the rest.
SCHEDULE_TEXT_SHOWN = 4_000
SCHEDULE_LIST_TEXT_SHOWN = 160
SCHEDULE_JSON_SHOWN = 50_000


def condition_text(raw) -> str:
    """`all(orders, any(customers, alias:cleaned))` for a stored schedule; `manual` for none."""
    if raw is None:
        return "manual only"

    def text(node) -> str:
        match node:
            case conditions.AssetRef(name=name, uri=uri):
                return name if name == uri else f"{name} ({uri})"
            case conditions.AliasRef(name=name):
                return f"alias:{name}"
            case conditions.AllOf(children=children):
                return "all(" + ", ".join(text(c) for c in children) + ")"
            case conditions.AnyOf(children=children):
                return "any(" + ", ".join(text(c) for c in children) + ")"
        raise TypeError(node)

    try:
        return text(conditions.parse(raw))
    except conditions.ConditionError as exc:
        return f"cannot be evaluated: {limits.abbreviate(exc.path)}: {exc.message}"


def time_text(dag: Dag) -> str:
    """The Dag's timetable as a person reads it ("At 03:00, Europe/Zurich", "Every hour"), or
    "" without one."""
    if dag.timetable is None:
        return ""
    try:
        return timetables.Timetable.from_spec(dag.timetable, timezone=dag.timezone).text
    except timetables.TimetableError as exc:
        return f"timetable cannot be read: {exc}"


def schedule_text(dag: Dag) -> str:
    """The whole schedule in words: its assets (`condition_text`), its time, or both as its
    `schedule_mode` combines them."""
    time = time_text(dag)
    if not time:
        return condition_text(dag.schedule)
    if dag.schedule is None:
        return time
    assets = condition_text(dag.schedule)
    if dag.schedule_mode == ScheduleMode.ASSET_AND_TIME:
        return f"{time}, when {assets} had events since the tick before"
    return f"{time}, or on {assets}"


def consumption_text(dag: Dag) -> str:
    """How many queued events one of its asset-triggered runs consumes (issue 28), in words."""
    if dag.max_events_per_run is None:
        return "batch: a run consumes every event queued when its condition is met"
    if dag.max_events_per_run == 1:
        return "per_event: one run per event, in event order"
    return f"max_events {dag.max_events_per_run}: runs of at most that many events, oldest first"


class ScheduleFilter(admin.SimpleListFilter):
    title = "schedule"
    parameter_name = "scheduled"

    def lookups(self, request, model_admin):
        return (
            ("assets", "on assets"),
            ("time", "on time"),
            ("both", "on assets and time"),
            ("manual", "manual only"),
        )

    def queryset(self, request, queryset):
        if self.value() == "assets":
            return queryset.filter(schedule__isnull=False)
        if self.value() == "time":
            return queryset.filter(timetable__isnull=False)
        if self.value() == "both":
            return queryset.filter(schedule__isnull=False, timetable__isnull=False)
        if self.value() == "manual":
            return queryset.filter(schedule__isnull=True, timetable__isnull=True)
        return queryset


class TagFilter(admin.SimpleListFilter):
    """Dags with a tag (Airflow's tag filter): the tags of every Dag, one query."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tags = {tag for tags in Dag.objects.values_list("tags", flat=True) for tag in tags or ()}
        return [(tag, tag) for tag in sorted(tags)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(tags__contains=[self.value()])
        return queryset


class SchedulerErrorFilter(admin.SimpleListFilter):
    title = "scheduler"
    parameter_name = "evaluable"

    def lookups(self, request, model_admin):
        return (("no", "cannot be evaluated"), ("yes", "evaluates"))

    def queryset(self, request, queryset):
        if self.value() == "no":
            return queryset.exclude(schedule_error="")
        if self.value() == "yes":
            return queryset.filter(schedule_error="")
        return queryset


# The Dag page's task table lists at most this many tasks (issue 45's 1,000-task Dag).
TASK_INLINE_MAX = 100


class TaskInline(admin.TabularInline):
    model = Task
    fields = (
        "task_id",
        "upstream_ids",
        "trigger_rule",
        "retries",
        "retry_delay_seconds",
        "outlets",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def get_queryset(self, request):
        # Airflow's order (`task_order`: topological, group by group), as the grid's.
        dag_id = unquote(
            (request.resolver_match.kwargs if request.resolver_match else {}).get("object_id", "")
        )
        # The Dag page's shape (`DagAdmin.get_object`) when it has read it: no query here.
        shape = getattr(request, "dag_shape", None)
        rows = shape.rows() if shape is not None else task_order.dag_task_rows(dag_id=dag_id)
        ordered = [row.task_id for row in rows if row.task_id]
        queryset = super().get_queryset(request)
        if len(ordered) > TASK_INLINE_MAX:
            # A big Dag (1,000 tasks: 2.9 s of form widgets) lists its first tasks in order;
            # the graph, the grid and the task list show them all.
            self.verbose_name_plural = (
                f"tasks: the first {TASK_INLINE_MAX} of {len(ordered):,} in task order (the "
                "graph, the grid and the task list show every one)"
            )
            ordered = ordered[:TASK_INLINE_MAX]
            queryset = queryset.filter(task_id__in=ordered)
        rank = [When(task_id=task_id, then=Value(i)) for i, task_id in enumerate(ordered)]
        if rank:
            queryset = queryset.order_by(Case(*rank, default=Value(len(rank))), "task_id")
        return queryset.prefetch_related(
            Prefetch(
                "outlet_asset_refs",
                queryset=TaskOutletAssetReference.objects.select_related("asset"),
            ),
            Prefetch(
                "outlet_alias_refs",
                queryset=TaskOutletAliasReference.objects.select_related("alias"),
            ),
            Prefetch("upstream_links", queryset=TaskUpstream.objects.select_related("upstream")),
        )

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description="upstream")
    def upstream_ids(self, obj):
        return ", ".join(sorted(link.upstream.task_id for link in obj.upstream_links.all())) or "-"

    @admin.display(description="outlets")
    def outlets(self, obj):
        names = [r.asset.name for r in obj.outlet_asset_refs.all()]
        names += [f"alias:{r.alias.name}" for r in obj.outlet_alias_refs.all()]
        return ", ".join(names) or "-"


@admin.register(Dag)
class DagAdmin(admin.ModelAdmin):
    """Dags come from `sync_dags`; operators may pause them and change `max_active_runs`."""

    list_display = (
        "dag_id",
        "paused_view",
        "tag_badges",
        "schedule_summary",
        "next_run",
        "scheduler_status",
        "task_count",
        "queued_event_count",
        "active_run_count",
        "last_run_at",
        "grid_link",
    )
    list_filter = ("is_paused", TagFilter, ScheduleFilter, SchedulerErrorFilter)
    search_fields = ("dag_id", "description")
    inlines = (TaskInline,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "dag_id",
                    "description",
                    "tag_list",
                    "owners",
                    "documentation",
                    "is_paused",
                    "max_active_runs",
                    "schedule_summary",
                    "consumption",
                    "next_run",
                    "time_bounds",
                    "scheduler_status",
                    "queued_events_summary",
                    "fileloc",
                    "bundle_status",
                )
            },
        ),
        ("Graph", {"fields": ("task_graph",), "classes": ("aes-wide",)}),
        (
            "Recent runs and the events they consumed",
            {"fields": ("recent_runs",), "classes": ("aes-wide",)},
        ),
        ("Code", {"fields": ("code_view",), "classes": ("aes-wide",)}),
        (
            "Stored definition",
            {"fields": ("schedule_json", "created_at", "updated_at"), "classes": ("collapse",)},
        ),
    )
    readonly_fields = (
        "dag_id",
        "description",
        "tag_list",
        "owners",
        "documentation",
        "schedule_summary",
        "consumption",
        "next_run",
        "time_bounds",
        "scheduler_status",
        "schedule_json",
        "queued_events_summary",
        "fileloc",
        "bundle_status",
        "created_at",
        "updated_at",
        "recent_runs",
        "task_graph",
        "code_view",
    )

    def has_add_permission(self, request):
        return False

    def get_list_display(self, request):
        """The pause toggle and the trigger button for those who may use them (issue 45)."""
        shown = list(super().get_list_display(request))
        if self.has_change_permission(request):
            shown[shown.index("paused_view")] = "paused_toggle"
        if self.has_trigger_permission(request):
            shown[shown.index("grid_link")] = "grid_and_trigger"
        return shown

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "is_paused" in form.changed_data:
            # Audited as the list's toggle and the API's (`dag.pause` / `dag.unpause`), in the
            # change view's transaction.
            dags.audit_pause(dag_id=obj.dag_id, is_paused=obj.is_paused, actor=actor_of(request))
            if not obj.is_paused:
                # As the API's: the next run of that instant stored (issue 40), the schedulers
                # woken.
                dags.after_unpause([obj.dag_id])

    def has_delete_permission(self, request, obj=None):
        # Dags come and go with their definitions (sync_dags); deleting one here would cascade
        # to its tasks, runs and queued events, which the admin does not offer either.
        return False

    def get_queryset(self, request):
        last_run = DagRun.objects.filter(dag=OuterRef("pk")).order_by().values("dag")
        return (
            super()
            .get_queryset(request)
            .annotate(
                task_count=count_of(Task, "dag"),
                queued_event_count=count_of(AssetDagRunQueue, "target_dag"),
                active_run_count=count_of(
                    DagRun, "dag", state__in=[DagRunState.QUEUED, DagRunState.RUNNING]
                ),
                last_run_at=Subquery(last_run.annotate(m=Max("run_after")).values("m")),
                last_state=Subquery(
                    DagRun.objects.filter(dag=OuterRef("pk"))
                    .order_by("-run_after", "-id")
                    .values("state")[:1]
                ),
                import_error_id=Subquery(
                    DagImportError.objects.filter(
                        filename=OuterRef("fileloc"), bundle_name=OuterRef("bundle_name")
                    ).values("pk")[:1]
                ),
            )
        )

    @admin.display(description="state", ordering="is_paused")
    def paused_view(self, obj):
        """ "active" or "paused" in words (Django's boolean icon drew a red cross on every
        active Dag, under a column named "is paused")."""
        word = "paused" if obj.is_paused else "active"
        return format_html(
            '<span class="aes-badge aes-badge-{}">{}</span>',
            "paused" if obj.is_paused else "ok",
            word,
        )

    @admin.display(description="state", ordering="is_paused")
    def paused_toggle(self, obj):
        """The state badge as a button that pauses or unpauses the Dag: a POST of the list's
        own form (its CSRF token) to `pause_view`."""
        return format_html(
            '<button type="submit" formaction="{}" name="is_paused" value="{}" '
            'class="aes-badge aes-badge-{} aes-toggle" data-dag="{}" title="{}">{}</button>',
            reverse("admin:assets_app_dag_pause", args=[obj.pk]),
            "0" if obj.is_paused else "1",
            "paused" if obj.is_paused else "ok",
            obj.dag_id,
            "Unpause this Dag" if obj.is_paused else "Pause this Dag",
            "paused" if obj.is_paused else "active",
        )

    @admin.display(description="tags")
    def tag_badges(self, obj):
        url = reverse("admin:assets_app_dag_changelist")
        return (
            format_html_join(
                " ",
                '<a class="aes-tag" href="{}?tag={}">{}</a>',
                ((url, quote_plus(tag), tag) for tag in sorted(obj.tags)),
            )
            or "-"
        )

    @admin.display(description="tags")
    def tag_list(self, obj):
        return ", ".join(sorted(obj.tags)) or "-"

    @admin.display(description="doc_md")
    def documentation(self, obj):
        """The Dag's `doc_md` as its text (escaped, de-indented as Airflow shows it)."""
        if not obj.doc_md:
            return "-"
        return format_html('<pre class="aes-doc-md">{}</pre>', inspect.cleandoc(obj.doc_md))

    @admin.display(description="next run", ordering="next_dagrun_create_after")
    def next_run(self, obj):
        """When the timetable's next run is due, and its logical date when that differs
        (Airflow's `next_dagrun_create_after` and `next_dagrun`); "-" without a timetable."""
        if obj.timetable is None:
            return "-"
        if obj.next_dagrun_create_after is None:
            return "none (the schedule has ended)"
        due = timezone.localtime(obj.next_dagrun_create_after)
        text = due.strftime("%Y-%m-%d %H:%M %Z")
        if obj.next_dagrun is not None and obj.next_dagrun != obj.next_dagrun_create_after:
            logical = timezone.localtime(obj.next_dagrun).strftime("%Y-%m-%d %H:%M %Z")
            return format_html('{} <span class="aes-muted">(logical date {})</span>', text, logical)
        return text

    @admin.display(description="time zone, dates, catchup")
    def time_bounds(self, obj):
        """Of every Dag that has them (issue 39: a manual or asset Dag's too, as Airflow's)."""
        untimed = obj.start_date is None and obj.end_date is None and obj.timezone == "UTC"
        if obj.timetable is None and untimed:
            return "-"

        def day(value):
            return timezone.localtime(value).strftime("%Y-%m-%d %H:%M %Z") if value else "none"

        return (
            f"{obj.timezone}; from {day(obj.start_date)} to {day(obj.end_date)}; "
            f"catchup {'on' if obj.catchup else 'off'}"
        )

    @admin.display(description="events per run")
    def consumption(self, obj):
        return consumption_text(obj) if obj.schedule is not None else "-"

    @admin.display(description="schedule")
    def schedule_summary(self, obj):
        text = schedule_text(obj)
        # The changelist shows a line of it; the Dag page a screenful and a link to every asset.
        limit = (
            SCHEDULE_TEXT_SHOWN
            if getattr(obj, "_on_change_page", False)
            else (SCHEDULE_LIST_TEXT_SHOWN)
        )
        if len(text) <= limit:
            return text
        url = reverse("admin:assets_app_dagscheduleassetreference_changelist")
        return format_html(
            '{}… <a href="{}?dag__dag_id__exact={}">every asset it waits on</a>',
            text[:limit],
            url,
            obj.dag_id,
        )

    @admin.display(description="scheduler")
    def scheduler_status(self, obj):
        """ "evaluates", or the error the scheduler recorded when it last could not evaluate the
        Dag (it skips the Dag, its events wait, the other Dags go on)."""
        if getattr(obj, "import_error_id", None) is not None:
            return format_html(
                '<a class="aes-badge aes-badge-bad" href="{}" title="its file did not import at '
                'the last sync; the Dag runs as it was last synced">import error</a>',
                reverse("admin:assets_app_dagimporterror_change", args=[obj.import_error_id]),
            )
        if not obj.schedule_error:
            return "evaluates"
        return format_html(
            '<span class="aes-badge aes-badge-bad" title="{}">cannot be evaluated</span> '
            '<span class="aes-muted">since {}: {}</span>',
            obj.schedule_error,
            obj.schedule_error_at.strftime("%Y-%m-%d %H:%M UTC") if obj.schedule_error_at else "?",
            obj.schedule_error[:SCHEDULE_LIST_TEXT_SHOWN],
        )

    @admin.display(description="bundle")
    def bundle_status(self, obj):
        """The Dag bundle it was synced from and whether a worker serves it (issue 44): a
        worker serving it claimed within `bundles.SERVED_WITHIN`, or a badge saying none did
        (its TIs wait: no worker of another bundle claims them)."""
        if not obj.bundle_name:
            return "none (a JSON definition: run by a worker that names no bundle)"
        seen = WorkerBundle.objects.filter(bundle_name=obj.bundle_name).first()
        since = timezone.now() - bundles.SERVED_WITHIN
        if seen is not None and seen.last_claim_at >= since:
            return format_html(
                '{} <span class="aes-muted">served: last claim {} by {}</span>',
                obj.bundle_name,
                seen.last_claim_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
                seen.last_hostname,
            )
        return format_html(
            '{} <span class="aes-badge aes-badge-bad">no worker serves it</span> '
            '<span class="aes-muted">no worker serving this bundle claimed in the last {} '
            "minutes ({}); its tasks wait for one (bin/airflow-worker --bundle {})</span>",
            obj.bundle_name,
            int(bundles.SERVED_WITHIN.total_seconds() // 60),
            "last claim " + seen.last_claim_at.strftime("%Y-%m-%d %H:%M UTC")
            if seen is not None
            else "never",
            obj.bundle_name,
        )

    @admin.display(description="schedule (stored JSON)")
    def schedule_json(self, obj):
        if obj.schedule is None:
            return pretty_json(None)
        text = limits.display_json(obj.schedule, indent=2)
        if len(text) <= SCHEDULE_JSON_SHOWN:
            return pretty_json(obj.schedule)
        return format_html(
            '<pre class="aes-json">{}\n… ({} characters in all)</pre>',
            text[:SCHEDULE_JSON_SHOWN],
            len(text),
        )

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            obj._on_change_page = True
            obj.request = request  # the task graph's open groups (?open=)
            # Read once for the graph and the tasks' order (TaskInline).
            obj.shape = request.dag_shape = task_graph.load(
                dag_id=obj.dag_id, task_groups=obj.task_groups
            )
        return obj

    @admin.display(description="tasks", ordering="task_count")
    def task_count(self, obj):
        return obj.task_count

    @admin.display(description="queued events", ordering="queued_event_count")
    def queued_event_count(self, obj):
        url = reverse("admin:assets_app_dag_queued_events", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.queued_event_count)

    @admin.display(description="active runs", ordering="active_run_count")
    def active_run_count(self, obj):
        return f"{obj.active_run_count} / {obj.max_active_runs}"

    @admin.display(description="last run", ordering="last_run_at")
    def last_run_at(self, obj):
        """The latest run's state over its time, in one column (two did not fit 1,400 px)."""
        when = display_for_value(obj.last_run_at, "-")
        if not obj.last_state:
            return when
        return format_html("{}<br>{}", state_badge(obj.last_state), when)

    @admin.display(description="queued events")
    def queued_events_summary(self, obj):
        url = reverse("admin:assets_app_dag_queued_events", args=[obj.pk])
        waiting = AssetDagRunQueue.objects.filter(target_dag=obj).count()
        return format_html(
            '{} waiting · <a href="{}">see them and which parts of the schedule are met</a>',
            waiting,
            url,
        )

    @admin.display(description=f"last {RECENT_RUNS} runs and the events they consumed")
    def recent_runs(self, obj):
        runs = (
            DagRun.objects.filter(dag=obj)
            .order_by("-id")
            .prefetch_related(
                Prefetch(
                    "consumed_links",
                    queryset=DagRunAssetEvent.objects.select_related("asset_event__asset").order_by(
                        "asset_event_id"
                    ),
                )
            )[:RECENT_RUNS]
        )
        return render_to_string("admin/assets_app/run_list.html", {"runs": runs})

    @admin.display(description="")
    def task_graph(self, obj):
        """Tasks and their upstream edges laid out left to right (`task_graph`), from the
        shape `get_object` read (two queries, shared with the tasks' order)."""
        return task_graph_view.render(
            shape=obj.shape,
            request=getattr(obj, "request", None),
        )

    @admin.display(description="")
    def code_view(self, obj):
        """The Dag's file as the worker last synced it (`definitions.sources`), read only:
        escaped, one line a row with its number, monospace; a cut file says so."""
        code = sources.source_of(obj.fileloc)
        if code is None:
            return format_html(
                '<p id="dag-code" class="aes-muted">No source stored for {}: the worker\'s sync '
                "(<code>bin/airflow-worker --sync-only</code>) sends each DAG file's text; a Dag "
                "synced from a definition file, or whose file left the folder, has none.</p>",
                obj.fileloc or "this Dag",
            )
        lines = code.source_code.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return format_html(
            '<div id="dag-code" class="aes-source-wrap"><p class="aes-muted">{} · {} lines · {} '
            'bytes · synced {}</p>{}<pre class="aes-source">{}</pre></div>',
            code.fileloc,
            f"{len(lines):,}",
            f"{code.source_size:,}",
            display_for_value(code.last_updated, ""),
            format_html('<p class="aes-warning-box">{}</p>', sources.note(code))
            if code.truncated
            else "",
            format_html_join(
                "", '<span class="aes-source-line">{}\n</span>', ((line,) for line in lines)
            ),
        )

    @admin.display(description="runs")
    def grid_link(self, obj):
        url = reverse("admin:assets_app_dag_grid", args=[obj.pk])
        return format_html('<a href="{}">grid</a>', url)

    @admin.display(description="runs")
    def grid_and_trigger(self, obj):
        """The grid link and a trigger button: a POST of the list's form (`trigger_view`,
        conf {}) for a Dag without params, the trigger form (conf from the params) for one
        with params, as Airflow's trigger opens its form when the Dag has params."""
        grid = reverse("admin:assets_app_dag_grid", args=[obj.pk])
        trigger = reverse("admin:assets_app_dag_trigger", args=[obj.pk])
        if obj.params:
            button = format_html(
                '<a href="{}" class="aes-trigger" title="Trigger a run (with params)…">▶…</a>',
                trigger,
            )
        else:
            button = format_html(
                '<button type="submit" formaction="{}" name="from_list" value="1" '
                'class="aes-trigger" data-dag="{}" title="Trigger a run now">▶</button>',
                trigger,
                obj.dag_id,
            )
        return format_html('<a href="{}">grid</a> {}', grid, button)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/pause/", view(self.pause_view), name="assets_app_dag_pause"),
            path("lineage/", view(self.lineage_view), name="assets_app_dag_lineage"),
            path(
                "<path:object_id>/queued-events/",
                view(self.queued_events_view),
                name="assets_app_dag_queued_events",
            ),
            path("<path:object_id>/grid/", view(self.grid_view), name="assets_app_dag_grid"),
            path(
                "<path:object_id>/trigger/", view(self.trigger_view), name="assets_app_dag_trigger"
            ),
            *super().get_urls(),
        ]

    def grid_view(self, request, object_id):
        """Recent runs x tasks, coloured by state (`run_grid`: a fixed number of queries); the
        last 25 runs, or `?runs=` one of `GRID_RUN_CHOICES`."""
        if not self.has_view_permission(request):
            raise Http404
        dag = get_object_or_404(Dag, pk=object_id)
        legend = sorted(
            {
                (str(state), colour)
                for state, colour in STATE_COLOURS.items()
                if state in TIState.values
            }
        )
        wanted = request.GET.get("runs", "")
        shown = int(wanted) if wanted.isdigit() and int(wanted) in GRID_RUN_CHOICES else GRID_RUNS
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Runs of {dag.dag_id}",
            "grid": run_grid(dag=dag, runs=shown),
            "run_choices": [(n, n == shown) for n in GRID_RUN_CHOICES],
            "legend": legend,
            "tz_name": timezone.get_current_timezone_name(),
        }
        return TemplateResponse(request, "admin/assets_app/dag_grid.html", context)

    def pause_view(self, request, object_id):
        """POST `is_paused` 1 or 0: pause or unpause the Dag (`dags.set_paused`: audited,
        idempotent, an unpause stores its next run), then back to the page it came from."""
        if request.method != "POST" or not self.has_change_permission(request):
            raise PermissionDenied
        dag = get_object_or_404(Dag, pk=object_id)
        wanted = request.POST.get("is_paused")
        if wanted not in ("0", "1"):
            return HttpResponseBadRequest("is_paused must be 1 (pause) or 0 (unpause)")
        dags.set_paused(dag_id=dag.dag_id, is_paused=wanted == "1", actor=actor_of(request))
        self.message_user(request, f"{'Paused' if wanted == '1' else 'Unpaused'} {dag.dag_id}.")
        return HttpResponseRedirect(_back(request))

    def trigger_view(self, request, object_id):
        """A manual run with a conf (`runs.trigger_dag`, as the API and `trigger_dag` do). A
        Dag with params gets a field per Param (`param_form`) and a JSON text area for more
        keys (they win over the fields); a Dag without, the JSON text area alone. A field that
        holds no value of its kind, a conf that is not a JSON object or that a Param refuses
        (`params.check_conf`) is answered 400 with the form and the reason; nothing is written."""
        if not self.has_trigger_permission(request):
            raise Http404
        dag = get_object_or_404(Dag, pk=object_id)
        specs = dag_params.load(dag.params)
        conf_text, note, error, posted = "{}", "", None, None
        field_errors: dict[str, str] = {}
        if request.method == "POST":
            conf_text = request.POST.get("conf", "").strip() or "{}"
            note = request.POST.get("note", "").strip()
            from_fields: dict[str, Any] = {}
            if specs and request.POST.get("param_fields") == "1":
                posted = request.POST
                from_fields, field_errors = param_form.conf_from_fields(specs, posted)
            try:
                if field_errors:
                    raise exceptions.BadRequest(
                        "; ".join(f"{name}: {why}" for name, why in field_errors.items())
                    )
                conf = json.loads(conf_text)
                if specs and isinstance(conf, dict):
                    conf = {**from_fields, **conf}
                run = runs.trigger_dag(
                    dag_id=dag.dag_id,
                    conf=conf,
                    note=note or None,
                    triggering_user_name=request.user.get_username(),
                    actor=actor_of(request),
                )
            except json.JSONDecodeError as exc:
                error = f"conf is not valid JSON: {exc}"
            except exceptions.DomainError as exc:
                error = exc.message
            else:
                self.message_user(request, f"Triggered run {run.run_id} of {dag.dag_id}.")
                if request.POST.get("from_list") == "1":
                    return HttpResponseRedirect(_back(request))
                return HttpResponseRedirect(
                    reverse("admin:assets_app_dagrun_change", args=[run.pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Trigger {dag.dag_id}",
            "dag": dag,
            "fields": param_form.fields(specs, posted, field_errors),
            "conf": conf_text,
            "note": note,
            "error": error,
        }
        return TemplateResponse(
            request,
            "admin/assets_app/dag_trigger.html",
            context,
            status=400 if error else 200,
        )

    def has_clear_queued_events_permission(self, request):
        """The admin's own clear action (`AssetDagRunQueueAdmin`) and the public API's DELETE
        need the same: deleting queued events is `delete_assetdagrunqueue`, not `change_dag`."""
        return request.user.has_perm("assets_app.delete_assetdagrunqueue")

    def has_trigger_permission(self, request):
        return request.user.has_perm("assets_app.add_dagrun")

    def lineage_view(self, request):
        """Dags, assets and aliases as a laid-out graph (`lineage`), optionally one
        neighbourhood (`?asset=NAME` or `?dag=DAG_ID`, `&depth=N`)."""
        if not self.has_view_permission(request):
            raise Http404
        from . import lineage

        return lineage.lineage_view(request, admin_site=self.admin_site, opts=self.opts)

    def queued_events_view(self, request, object_id):
        """The Dag's ADRQ rows by asset, its condition with the met parts, and "clear"."""
        if not self.has_view_permission(request):
            raise Http404
        dag = get_object_or_404(Dag, pk=object_id)
        if request.method == "POST":
            if not self.has_clear_queued_events_permission(request):
                raise PermissionDenied
            asset_id = request.POST.get("asset_id") or None
            cleared = queued_events.clear_queued_events(
                dag_id=dag.dag_id,
                asset_id=int(asset_id) if asset_id else None,
                actor=actor_of(request),
            )
            self.message_user(request, f"Cleared {cleared} queued events of {dag.dag_id}.")
            return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            **queued_events_context(dag),
            "opts": self.opts,
            "title": f"Queued events of {dag.dag_id}",
            "can_clear": self.has_clear_queued_events_permission(request),
        }
        return TemplateResponse(request, "admin/assets_app/dag_queued_events.html", context)


def _back(request) -> str:
    """The Dag list the request came from (its filters and page kept), else the list."""
    referer = request.META.get("HTTP_REFERER", "")
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return reverse("admin:assets_app_dag_changelist")


def queued_events_context(dag: Dag) -> dict:
    """What the queued-events page shows. Five queries whatever the number of rows."""
    now = timezone.now()
    by_asset: list[dict[str, Any]] = [
        {**group, "oldest_age": duration(now - group["oldest"])}
        for group in AssetDagRunQueue.objects.filter(target_dag=dag)
        .values("asset_id", "asset__name", "asset__uri")
        .annotate(n=Count("id"), oldest=Min("created_at"), newest=Max("created_at"))
        .order_by("asset__name")
    ]
    rows = (
        AssetDagRunQueue.objects.filter(target_dag=dag)
        .select_related("asset", "asset_event")
        .order_by("asset_event_id")[:QUEUED_ROWS_SHOWN]
    )
    tree = None
    try:
        condition = conditions.parse(dag.schedule) if dag.schedule is not None else None
    except conditions.ConditionError:
        condition = None  # `schedule_text` says why
    if condition is not None:
        aliases = conditions.referenced_aliases(condition)
        alias_assets: dict[str, set[str]] = {name: set() for name in aliases}
        for alias_name, asset_name in AssetAliasAsset.objects.filter(
            alias__name__in=aliases
        ).values_list("alias__name", "asset__name"):
            alias_assets[alias_name].add(asset_name)
        status = conditions.explain(
            condition, present={g["asset__name"] for g in by_asset}, alias_assets=alias_assets
        )
        tree = _status_tree(status, alias_assets)
    total = sum(g["n"] for g in by_asset)
    return {
        "dag": dag,
        "by_asset": by_asset,
        "rows": [(row, duration(now - row.created_at)) for row in rows],
        "total": total,
        "shown": min(total, QUEUED_ROWS_SHOWN),
        "tree": tree,
        "schedule_text": condition_text(dag.schedule),
    }


def _status_tree(status: conditions.ConditionStatus, alias_assets) -> dict:
    node = status.condition
    match node:
        case conditions.AssetRef(name=name):
            label, kind = name, "asset"
        case conditions.AliasRef(name=name):
            resolved = ", ".join(sorted(alias_assets.get(name, ()))) or "no assets yet"
            label, kind = f"alias {name} → {resolved}", "alias"
        case conditions.AllOf():
            label, kind = "all of", "all"
        case _:
            label, kind = "any of", "any"
    return {
        "label": label,
        "kind": kind,
        "met": status.met,
        "children": [_status_tree(c, alias_assets) for c in status.children],
    }


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    # Short headers and paired counts: the list fits a 1,400 px window beside its filters.
    list_display = (
        "task_id",
        "dag",
        "trigger_rule",
        "upstream_count",
        "retries_and_delay",
        "outlet_counts",
    )
    list_select_related = ("dag",)
    list_filter = ("dag", "trigger_rule", "is_setup", "is_teardown")
    search_fields = ("task_id", "dag__dag_id")

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                outlet_asset_count=count_of(TaskOutletAssetReference, "task"),
                outlet_alias_count=count_of(TaskOutletAliasReference, "task"),
                upstream_count=count_of(TaskUpstream, "task"),
            )
        )

    @admin.display(description="upstream", ordering="upstream_count")
    def upstream_count(self, obj):
        return obj.upstream_count

    @admin.display(description="retries (delay)", ordering="retries")
    def retries_and_delay(self, obj):
        return f"{obj.retries} ({obj.retry_delay_seconds:g} s)"

    @admin.display(description="outlets: assets / aliases", ordering="outlet_asset_count")
    def outlet_counts(self, obj):
        return f"{obj.outlet_asset_count} / {obj.outlet_alias_count}"


@admin.register(TaskOutletAssetReference)
class TaskOutletAssetReferenceAdmin(LinkTableAdmin):
    list_display = ("task", "asset")
    list_select_related = ("task", "asset")
    search_fields = ("task__task_id", "task__dag__dag_id", "asset__name")


@admin.register(TaskOutletAliasReference)
class TaskOutletAliasReferenceAdmin(LinkTableAdmin):
    list_display = ("task", "alias")
    list_select_related = ("task", "alias")
    search_fields = ("task__task_id", "task__dag__dag_id", "alias__name")


@admin.register(TaskUpstream)
class TaskUpstreamAdmin(LinkTableAdmin):
    """ "task runs after upstream" links, from `sync_dags`."""

    list_display = ("upstream", "task")
    list_select_related = ("task", "upstream")
    list_filter = ("task__dag",)
    search_fields = ("task__task_id", "upstream__task_id", "task__dag__dag_id")


@admin.register(TaskSetupLink)
class TaskSetupLinkAdmin(LinkTableAdmin):
    """ "task waits for other" beyond its direct upstream (issue 39: an indirect setup, a
    teardown's scope), derived by `sync_dags`."""

    list_display = ("other", "task", "kind")
    list_select_related = ("task", "other")
    list_filter = ("kind", "task__dag")
    search_fields = ("task__task_id", "other__task_id", "task__dag__dag_id")


@admin.register(DagScheduleAssetReference)
class DagScheduleAssetReferenceAdmin(LinkTableAdmin):
    list_display = ("dag", "asset")
    list_select_related = ("dag", "asset")
    list_filter = ("dag",)
    search_fields = ("dag__dag_id", "asset__name")


@admin.register(DagScheduleAliasReference)
class DagScheduleAliasReferenceAdmin(LinkTableAdmin):
    list_display = ("dag", "alias")
    list_select_related = ("dag", "alias")
    list_filter = ("dag",)
    search_fields = ("dag__dag_id", "alias__name")


@admin.register(DagImportError)
class DagImportErrorAdmin(ReadOnlyAdmin):
    """The Dag files that did not import at the last sync (Airflow's import errors): each sync
    replaces them; the files' Dags run as they were last synced."""

    list_display = ("filename", "bundle_name", "timestamp", "last_line")
    search_fields = ("filename",)
    readonly_fields = ("filename", "bundle_name", "timestamp", "stack_trace_text")
    fields = readonly_fields

    @admin.display(description="error")
    def last_line(self, obj):
        lines = obj.stack_trace.strip().splitlines()
        return format_html('<span class="aes-clip">{}</span>', lines[-1] if lines else "")

    @admin.display(description="stack trace")
    def stack_trace_text(self, obj):
        return format_html('<pre class="aes-json">{}</pre>', obj.stack_trace)


@admin.register(DagCode)
class DagCodeAdmin(ReadOnlyAdmin):
    """The DAG files' source as the worker last synced them (Airflow's `dag_code`, issue 45):
    each Dag's page shows its file's under "Code"; the sync replaces a changed file's and
    deletes the source of a file that left the folder."""

    list_display = ("fileloc", "size", "truncated", "last_updated")
    search_fields = ("fileloc",)
    readonly_fields = ("fileloc", "source_code_hash", "size", "truncated", "last_updated")
    fields = readonly_fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("source_code")

    @admin.display(description="bytes", ordering="source_size")
    def size(self, obj):
        return f"{obj.source_size:,}"


@admin.register(DagVersion)
class DagVersionAdmin(ReadOnlyAdmin):
    """The Dags' versions (Airflow's `dag_version`, issue 49): a sync that creates a Dag or
    changes its definition writes the next number (`GET /api/v2/dags/{id}/dagVersions`)."""

    list_display = ("dag_id", "version_number", "created_at")
    search_fields = ("dag__dag_id",)
    readonly_fields = ("dag", "version_number", "created_at")
    fields = readonly_fields


@admin.register(DagFavorite)
class DagFavoriteAdmin(ReadOnlyAdmin):
    """Users' favorite Dags (Airflow's `dag_favorite`, issue 49), set through the public API's
    `POST /dags/{id}/favorite` and `/unfavorite`."""

    list_display = ("user", "dag_id", "created_at")
    list_select_related = ("user",)
    readonly_fields = ("user", "dag", "created_at")
    fields = readonly_fields


@admin.register(WorkerBundle)
class WorkerBundleAdmin(ReadOnlyAdmin):
    """The Dag bundles workers serve and when one last claimed for each (issue 44): a Dag whose
    bundle no worker claimed for recently shows "no worker serves it" on its page and in
    `/healthz`."""

    list_display = ("bundle_name", "last_claim_at", "last_hostname")
    readonly_fields = list_display
    fields = readonly_fields
