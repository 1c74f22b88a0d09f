"""Dag runs, their task instances and the events each run consumed."""

from django.contrib import admin
from django.db.models import Count, Prefetch, Q
from django.template.loader import render_to_string
from django.utils.html import format_html

from ..models import (
    AssetAliasEvent,
    AssetEventQueue,
    DagRun,
    DagRunAssetEvent,
    TaskInstance,
    TIState,
)
from .base import ReadOnlyAdmin, admin_link, changelist_url, count_of, pretty_json

CONSUMED_SHOWN = 200


class TaskInstanceInline(admin.TabularInline):
    model = TaskInstance
    fields = ("link", "state", "try_number", "hostname", "start_date", "end_date")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="task")
    def link(self, obj):
        label = obj.task_id if obj.map_index < 0 else f"{obj.task_id}[{obj.map_index}]"
        return admin_link(obj, label)


@admin.register(DagRun)
class DagRunAdmin(admin.ModelAdmin):
    """Runs are written by the scheduler and the manual trigger; operators look and may delete."""

    list_display = (
        "run_id",
        "dag",
        "run_type",
        "state",
        "run_after",
        "consumed_event_count",
        "ti_summary",
    )
    list_filter = ("run_type", "state", "dag")
    list_select_related = ("dag",)
    search_fields = ("run_id", "dag__dag_id")
    date_hierarchy = "run_after"
    inlines = (TaskInstanceInline,)
    readonly_fields = ("conf_json", "consumed_events_table")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "dag",
                    "run_id",
                    "run_type",
                    "state",
                    "run_after",
                    "logical_date",
                    "start_date",
                    "end_date",
                    "triggering_user_name",
                    "note",
                    "conf_json",
                )
            },
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
            )
        )

    @admin.display(description="consumed events", ordering="consumed_event_count")
    def consumed_event_count(self, obj):
        return obj.consumed_event_count

    @admin.display(description="tasks succeeded")
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


@admin.register(TaskInstance)
class TaskInstanceAdmin(admin.ModelAdmin):
    """TIs change only through the worker API (task_state owns their lock): view and delete."""

    list_display = (
        "id",
        "dag_id",
        "task_id",
        "run_id",
        "map_index",
        "try_number",
        "state",
        "hostname",
        "start_date",
        "end_date",
    )
    list_filter = ("state", "dag_id")
    search_fields = ("=id", "dag_id", "task_id", "run_id", "hostname")
    readonly_fields = ("dag_run_link", "outbox_rows")

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
class DagRunAssetEventAdmin(ReadOnlyAdmin):
    list_display = ("dag_run", "dag", "asset_event", "asset_name")
    list_select_related = ("dag_run", "dag", "asset_event__asset")
    list_filter = ("dag",)
    search_fields = ("dag_run__run_id", "dag__dag_id", "asset_event__asset__name")

    @admin.display(description="asset")
    def asset_name(self, obj):
        return obj.asset_event.asset.name
