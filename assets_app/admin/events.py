"""Asset events (append-only): where each came from and which runs consumed it."""

from django.contrib import admin
from django.db.models import Exists, OuterRef
from django.template.loader import render_to_string
from django.utils.html import format_html

from ..models import AssetAliasEvent, AssetDagRunQueue, AssetEvent, DagRunAssetEvent
from .base import (
    EstimatedCountMixin,
    LinkTableAdmin,
    ReadOnlyAdmin,
    admin_link,
    count_of,
    dag_id_filter,
    pretty_json,
)


class ConsumedFilter(admin.SimpleListFilter):
    title = "consumed"
    parameter_name = "consumed"

    def lookups(self, request, model_admin):
        return (("yes", "by at least one run"), ("no", "by no run yet"))

    def queryset(self, request, queryset):
        consumed = Exists(DagRunAssetEvent.objects.filter(asset_event=OuterRef("pk")))
        if self.value() == "yes":
            return queryset.filter(consumed)
        if self.value() == "no":
            return queryset.filter(~consumed)
        return queryset


@admin.register(AssetEvent)
class AssetEventAdmin(EstimatedCountMixin, ReadOnlyAdmin):
    list_display = (
        "id",
        "asset_link",
        "timestamp",
        "source",
        "consumer_count",
        "waiting_count",
    )
    list_select_related = ("asset",)
    list_filter = (ConsumedFilter, dag_id_filter("source_dag_id", "source dag id"))
    search_fields = (
        "asset__name",
        "asset__uri",
        "source_dag_id",
        "source_task_id",
        "=source_run_id",
    )
    readonly_fields = ("asset_link", "extra_json", "consumers", "via_aliases", "waiting_for")
    fields = (
        "asset_link",
        "timestamp",
        "extra_json",
        "source_dag_id",
        "source_run_id",
        "source_task_id",
        "source_map_index",
        "source_ti_id",
        "source_try_number",
        "external_key",
        "external_key_scope",
        "via_aliases",
        "consumers",
        "waiting_for",
    )

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                consumer_count=count_of(DagRunAssetEvent, "asset_event"),
                waiting_count=count_of(AssetDagRunQueue, "asset_event"),
            )
        )

    @admin.display(description="asset", ordering="asset__name")
    def asset_link(self, obj):
        return admin_link(obj.asset, obj.asset.name)

    @admin.display(description="source task")
    def source(self, obj):
        if not obj.source_dag_id:
            return "REST API" if obj.extra.get("from_rest_api") else "-"
        return format_html(
            '{}.{}<br><span class="aes-muted">{}</span>',
            obj.source_dag_id,
            obj.source_task_id,
            obj.source_run_id,
        )

    @admin.display(description="consumed by runs", ordering="consumer_count")
    def consumer_count(self, obj):
        return obj.consumer_count

    @admin.display(description="queued for Dags", ordering="waiting_count")
    def waiting_count(self, obj):
        return obj.waiting_count

    @admin.display(description="extra")
    def extra_json(self, obj):
        return pretty_json(obj.extra)

    @admin.display(description="consumed by runs")
    def consumers(self, obj):
        links = obj.consumed_links.select_related("dag_run").order_by("dag_run_id")
        return render_to_string("admin/assets_app/consumer_list.html", {"links": links})

    @admin.display(description="emitted through aliases")
    def via_aliases(self, obj):
        names = [link.alias.name for link in obj.alias_links.select_related("alias")]
        return ", ".join(names) or "-"

    @admin.display(description="queued for Dags (not consumed yet)")
    def waiting_for(self, obj):
        dag_ids = obj.queued_for.order_by("target_dag_id").values_list("target_dag_id", flat=True)
        return ", ".join(dag_ids) or "-"


@admin.register(AssetAliasEvent)
class AssetAliasEventAdmin(LinkTableAdmin):
    list_display = ("asset_event", "alias")
    list_select_related = ("asset_event", "alias")
    list_filter = ("alias",)
    search_fields = ("alias__name",)
