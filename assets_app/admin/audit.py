"""The audit trail: every operator action, filterable by action, actor, door, Dag and time."""

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from ..models import AuditEntry, AuditTarget
from .base import LinkTableAdmin, ReadOnlyAdmin, pretty_json

TARGETS_SHOWN = 200


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "via", "action", "summary_short", "dag_id", "row_count")
    list_filter = (
        "action",
        "via",
        ("actor_name", admin.AllValuesFieldListFilter),
        ("dag_id", admin.AllValuesFieldListFilter),
    )
    # `=targets__object_id`: "who touched outbox row 42" finds every entry naming that row.
    search_fields = ("summary", "actor_name", "=dag_id", "=targets__object_id")
    date_hierarchy = "at"
    show_full_result_count = False
    fields = ("at", "actor_name", "actor", "via", "action", "summary", "dag_id", "row_count")
    readonly_fields = ("targets_view", "detail_json")

    def get_fields(self, request, obj=None):
        return (*self.fields, "targets_view", "detail_json")

    @admin.display(description="what", ordering="summary")
    def summary_short(self, obj):
        text = obj.summary if len(obj.summary) <= 110 else obj.summary[:109] + "…"
        return format_html('<span title="{}">{}</span>', obj.summary, text)

    @admin.display(description="rows")
    def targets_view(self, obj):
        targets = list(AuditTarget.objects.filter(entry=obj).order_by("id")[: TARGETS_SHOWN + 1])
        more = len(targets) > TARGETS_SHOWN
        return (
            format_html(
                "{}{}",
                format_html_join(
                    ", ", "{} {}", ((t.kind, t.object_id) for t in targets[:TARGETS_SHOWN])
                ),
                f" … ({obj.row_count} in all)" if more else "",
            )
            if targets
            else "-"
        )

    @admin.display(description="detail")
    def detail_json(self, obj):
        return pretty_json(obj.detail)


@admin.register(AuditTarget)
class AuditTargetAdmin(LinkTableAdmin):
    """The rows of each entry: an internal table, reached from its entry (not on the index)."""

    list_display = ("entry", "kind", "object_id", "ti_id")
    list_select_related = ("entry",)
    list_filter = ("kind",)
    search_fields = ("=object_id", "=ti_id")
