"""Assets and aliases: what exists, who produces it, who consumes it, its recent events."""

from django.contrib import admin
from django.db.models import Max, OuterRef, Prefetch, Subquery
from django.template.loader import render_to_string
from django.utils.html import format_html

from ..catalog import asset_events
from ..models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetAliasEvent,
    AssetEvent,
    DagRunAssetEvent,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    FreshnessPolicy,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
)
from .base import LinkTableAdmin, ReadOnlyAdmin, actor_of, count_of, pretty_json

RECENT_EVENTS = 25


def recent_events_table(events) -> str:
    """The shared "recent events" table (asset and alias pages): source task, consuming runs."""
    events = events.select_related("asset").prefetch_related(
        Prefetch(
            "consumed_links",
            queryset=DagRunAssetEvent.objects.select_related("dag_run").order_by("dag_run_id"),
        ),
        Prefetch("alias_links", queryset=AssetAliasEvent.objects.select_related("alias")),
    )
    return render_to_string("admin/assets_app/recent_events.html", {"events": events})


@admin.register(Asset)
class AssetAdmin(ReadOnlyAdmin):
    """Assets are created by sync_dags and the drain. Operators may correct an asset's uri
    (`asset_events.change_asset_uri`, audited): the fix for an asset-key conflict."""

    list_display = ("name", "uri", "group", "event_count", "last_event_at", "created_at")
    list_filter = ("group",)
    search_fields = ("name", "uri")
    readonly_fields = (
        "name",
        "group",
        "extra_json",
        "created_at",
        "updated_at",
        "producers",
        "consumers",
        "recent_events",
        "freshness_state",
    )
    fieldsets = (
        (None, {"fields": ("name", "uri", "group", "extra_json", "created_at", "updated_at")}),
        ("Freshness", {"fields": ("freshness_state",)}),
        ("Producers and consumers", {"fields": ("producers", "consumers")}),
        ("Recent events", {"fields": ("recent_events",), "classes": ("aes-wide",)}),
    )

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("assets_app.change_asset")

    @admin.display(description="freshness")
    def freshness_state(self, obj):
        """Issue 29: the asset's freshness policy and its last evaluated state."""
        policy = FreshnessPolicy.objects.filter(asset=obj).first()
        if policy is None:
            return "no freshness policy"
        rule = (
            f"an event at least every {policy.interval_seconds} s"
            if policy.kind == "max_interval"
            else f"an event by each {policy.cron} ({policy.timezone})"
        )
        since = f" since {policy.state_since:%Y-%m-%d %H:%M:%S}" if policy.state_since else ""
        return format_html(
            '<strong class="aes-freshness-{}">{}</strong>{} · {} · due {}',
            policy.state,
            policy.state.upper(),
            since,
            rule,
            policy.due_at or "-",
        )

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Django wraps this view in atomic(); the change goes through a domain function with its
        # own durable transaction (and audit entry) instead.
        # Django's changeform_view is atomic() around this private method (no public hook).
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def save_model(self, request, obj, form, change):
        if change and "uri" in form.changed_data:
            asset_events.change_asset_uri(asset_id=obj.pk, uri=obj.uri, actor=actor_of(request))

    def get_queryset(self, request):
        last = AssetEvent.objects.filter(asset=OuterRef("pk")).order_by().values("asset")
        return (
            super()
            .get_queryset(request)
            .annotate(
                event_count=count_of(AssetEvent, "asset"),
                last_event_at=Subquery(last.annotate(m=Max("timestamp")).values("m")),
            )
        )

    @admin.display(description="events", ordering="event_count")
    def event_count(self, obj):
        return obj.event_count

    @admin.display(description="last event", ordering="last_event_at")
    def last_event_at(self, obj):
        return obj.last_event_at

    @admin.display(description="extra")
    def extra_json(self, obj):
        return pretty_json(obj.extra)

    @admin.display(description="produced by")
    def producers(self, obj):
        tasks = TaskOutletAssetReference.objects.filter(asset=obj).select_related("task")
        via_alias = TaskOutletAliasReference.objects.filter(
            alias__asset_links__asset=obj
        ).select_related("task", "alias")
        return render_to_string(
            "admin/assets_app/task_list.html", {"refs": tasks, "alias_refs": via_alias}
        )

    @admin.display(description="consumed by (scheduled on)")
    def consumers(self, obj):
        direct = DagScheduleAssetReference.objects.filter(asset=obj).select_related("dag")
        via_alias = DagScheduleAliasReference.objects.filter(
            alias__asset_links__asset=obj
        ).select_related("dag", "alias")
        return render_to_string(
            "admin/assets_app/dag_list.html", {"refs": direct, "alias_refs": via_alias}
        )

    @admin.display(description=f"last {RECENT_EVENTS} events")
    def recent_events(self, obj):
        return recent_events_table(obj.events.order_by("-timestamp", "-id")[:RECENT_EVENTS])


@admin.register(AssetAlias)
class AssetAliasAdmin(ReadOnlyAdmin):
    list_display = ("name", "group", "asset_count", "event_count", "created_at")
    list_filter = ("group",)
    search_fields = ("name",)
    readonly_fields = ("resolved_assets", "producers", "consumers", "recent_events")
    fieldsets = (
        (None, {"fields": ("name", "group", "created_at", "resolved_assets")}),
        ("Producers and consumers", {"fields": ("producers", "consumers")}),
        ("Recent events", {"fields": ("recent_events",), "classes": ("aes-wide",)}),
    )

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                asset_count=count_of(AssetAliasAsset, "alias"),
                event_count=count_of(AssetAlias.events.through, "alias"),
            )
        )

    @admin.display(description="assets", ordering="asset_count")
    def asset_count(self, obj):
        return obj.asset_count

    @admin.display(description="events", ordering="event_count")
    def event_count(self, obj):
        return obj.event_count

    @admin.display(description="resolves to")
    def resolved_assets(self, obj):
        links = obj.asset_links.select_related("asset").order_by("asset__name")
        return render_to_string("admin/assets_app/asset_list.html", {"links": links})

    @admin.display(description="produced by")
    def producers(self, obj):
        refs = TaskOutletAliasReference.objects.filter(alias=obj).select_related("task")
        return render_to_string("admin/assets_app/task_list.html", {"refs": refs})

    @admin.display(description="consumed by (scheduled on)")
    def consumers(self, obj):
        refs = DagScheduleAliasReference.objects.filter(alias=obj).select_related("dag")
        return render_to_string("admin/assets_app/dag_list.html", {"refs": refs})

    @admin.display(description=f"last {RECENT_EVENTS} events through this alias")
    def recent_events(self, obj):
        return recent_events_table(obj.events.order_by("-timestamp", "-id")[:RECENT_EVENTS])


@admin.register(AssetAliasAsset)
class AssetAliasAssetAdmin(LinkTableAdmin):
    list_display = ("alias", "asset", "created_at")
    list_select_related = ("alias", "asset")
    search_fields = ("alias__name", "asset__name", "asset__uri")
    list_filter = ("alias",)
