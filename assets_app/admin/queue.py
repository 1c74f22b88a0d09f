"""The two queues operators act on: the outbox (requeue / park / delete) and the ADRQ (clear).

Actions are thin: they call the same domain functions as `requeue_parked` and the DELETE
queuedEvents API (`outbox.requeue/park/delete_rows`, `queued_events.clear_queued_events`) and
report what those did, including rows they skipped because a drain held them at that moment.
"""

from datetime import datetime

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..catalog import queued_events
from ..models import Asset, AssetDagRunQueue, AssetEventQueue, AuditEntry
from ..outbox import rows as outbox
from .base import actor_of, admin_link, duration, first_line, pretty_json, relative

CONFIRM_PREVIEW_ROWS = 20


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip().isdigit()]


def titled(filter_class: type[admin.FieldListFilter], title: str) -> type[admin.FieldListFilter]:
    """A field list filter with a human title ("Dag" rather than "source dag id")."""

    class Titled(filter_class):  # type: ignore[valid-type, misc]  # (a class made at run time)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.title = title

    return Titled


class OutboxStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return (
            ("pending", "pending (not parked)"),
            ("due", "due now"),
            ("backing_off", "backing off"),
            ("parked", "parked"),
        )

    def queryset(self, request, queryset):
        now = timezone.now()
        match self.value():
            case "pending":
                return queryset.filter(parked_at__isnull=True)
            case "due":
                return queryset.filter(parked_at__isnull=True, next_attempt_at__lte=now)
            case "backing_off":
                return queryset.filter(
                    parked_at__isnull=True, next_attempt_at__gt=now, attempts__gt=0
                )
            case "parked":
                return queryset.filter(parked_at__isnull=False)
        return queryset


def outlets_in(rows) -> int:
    """Declared outlets carried by the rows: what `outbox.delete_rows` reports as lost."""
    return sum(len((row.payload or {}).get("outlets") or []) for row in rows)


@admin.register(AssetEventQueue)
class AssetEventQueueAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task_instance",
        "status",
        "attempts",
        "next_attempt",
        "error",
        "age",
    )
    list_display_links = ("id",)
    list_filter = (
        OutboxStatusFilter,
        ("source_dag_id", titled(admin.AllValuesFieldListFilter, "Dag")),
        ("source_task_id", titled(admin.AllValuesFieldListFilter, "task")),
        ("last_error_type", titled(admin.AllValuesFieldListFilter, "error type")),
    )
    search_fields = ("=ti_id", "source_dag_id", "source_task_id", "=source_run_id", "last_error")
    ordering = ("id",)
    show_full_result_count = False
    actions = ("requeue_now", "park_rows", "delete_outbox_rows")
    fields = (
        "task_instance",
        "status",
        "attempts",
        "next_attempt",
        "created_at",
        "updated_at",
        "parked_at",
        "park_reason_view",
        "last_error_type",
        "last_error_text",
        "attempt_history_view",
        "audit_view",
        "payload_view",
    )
    readonly_fields = fields

    # Rows are written by the worker API and the drain only; operators act through actions.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The row page offers the same actions as the list (they post to the changelist)."""
        actions = self.get_actions(request)
        labels = {
            "requeue_now": "Requeue now",
            "park_rows": "Park",
            "delete_outbox_rows": "Delete…",
        }
        extra_context = {
            **(extra_context or {}),
            "row_actions": [(name, label) for name, label in labels.items() if name in actions],
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def has_requeue_permission(self, request):
        return request.user.has_perm("assets_app.change_asseteventqueue")

    def has_remove_permission(self, request):
        return request.user.has_perm("assets_app.delete_asseteventqueue")

    @admin.display(description="task instance")
    def task_instance(self, obj):
        label = f"{obj.source_dag_id}.{obj.source_task_id}"
        if obj.source_map_index >= 0:
            label += f"[{obj.source_map_index}]"
        url = reverse("admin:assets_app_taskinstance_change", args=[obj.ti_id])
        return format_html(
            '<a href="{}">{}</a><br><span class="aes-muted">{} · try {}</span>',
            url,
            label,
            obj.source_run_id,
            obj.try_number,
        )

    @admin.display(description="status")
    def status(self, obj):
        if obj.parked_at is not None and obj.last_error_kind == "permanent":
            state, text = "parked", "parked: permanent"
        elif obj.parked_at is not None:
            state, text = "parked", "parked"
        elif obj.next_attempt_at <= timezone.now():
            state, text = "due", "due"
        elif obj.attempts:
            state, text = "backing_off", "backing off"
        else:
            state, text = "scheduled", "scheduled"
        return format_html('<span class="aes-badge aes-badge-{}">{}</span>', state, text)

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt(self, obj):
        if obj.parked_at is not None:
            return "-"
        return format_html(
            '<span title="{}">{}</span>',
            obj.next_attempt_at.isoformat(),
            relative(obj.next_attempt_at),
        )

    @admin.display(description="last error", ordering="last_error_type")
    def error(self, obj):
        if not obj.last_error:
            return "-"
        return format_html(
            '<span class="aes-clip" title="{}">{}</span><br><span class="aes-muted">{}{}</span>',
            obj.last_error,
            first_line(obj.last_error, 90),
            obj.last_error_type.rsplit(".", 1)[-1],
            f" · {obj.last_error_kind}" if obj.last_error_kind else "",
        )

    @admin.display(description="why parked, what to do")
    def park_reason_view(self, obj):
        if obj.parked_at is None:
            return "-"
        assets = Asset.objects.filter(pk__in=(obj.error_detail or {}).get("asset_ids") or [])
        links = format_html_join(
            ", ", "{}", ((admin_link(asset, f"asset #{asset.pk} {asset}"),) for asset in assets)
        )
        return format_html(
            '<div id="park-reason" class="aes-warning-box">{}{}</div>',
            obj.park_reason or "parked",
            format_html("<p>Conflicting: {}</p>", links) if links else "",
        )

    @admin.display(description="attempts so far")
    def attempt_history_view(self, obj):
        attempts = [
            {**a, "at": datetime.fromisoformat(a["at"]) if a.get("at") else None}
            for a in obj.attempt_history or []
        ]
        return render_to_string("admin/assets_app/attempt_history.html", {"attempts": attempts})

    @admin.display(description="operator actions on this row")
    def audit_view(self, obj):
        entries = AuditEntry.objects.filter(
            targets__kind="outbox_row", targets__object_id=str(obj.pk)
        ).order_by("-at")[:20]
        return render_to_string("admin/assets_app/audit_list.html", {"entries": entries})

    @admin.display(description="age", ordering="created_at")
    def age(self, obj):
        return duration(timezone.now() - obj.created_at)

    @admin.display(description="last error")
    def last_error_text(self, obj):
        return format_html('<pre class="aes-json">{}</pre>', obj.last_error or "-")

    @admin.display(description="payload")
    def payload_view(self, obj):
        payload = obj.payload or {}
        return render_to_string(
            "admin/assets_app/outbox_payload.html",
            {
                "source": payload.get("source") or {},
                "end_date": payload.get("end_date"),
                "outlets": payload.get("outlets") or [],
                "outlet_events": [
                    {**event, "extra_json": pretty_json(event.get("extra") or {})}
                    for event in payload.get("outlet_events") or []
                ],
                "raw": pretty_json(payload),
            },
        )

    def _report(self, request, verb: str, done: list[int], asked: int, skipped_why: str) -> None:
        if done:
            ids = ", ".join(str(i) for i in done[:20]) + (" …" if len(done) > 20 else "")
            self.message_user(request, f"{verb} {len(done)} outbox row(s): {ids}.")
        if asked > len(done):
            self.message_user(
                request,
                f"{asked - len(done)} selected row(s) were left alone: {skipped_why}.",
                messages.WARNING,
            )

    @admin.action(description="Requeue now (fresh attempts, due now)", permissions=["requeue"])
    def requeue_now(self, request, queryset):
        ids = list(queryset.values_list("id", flat=True))
        done = outbox.requeue(row_ids=ids, actor=actor_of(request))
        self._report(
            request, "Requeued", done, len(ids), "a drain was working on them (or they are gone)"
        )

    @admin.action(description="Park (drains leave them alone)", permissions=["requeue"])
    def park_rows(self, request, queryset):
        ids = list(queryset.values_list("id", flat=True))
        done = outbox.park(row_ids=ids, actor=actor_of(request))
        self._report(request, "Parked", done, len(ids), "already parked, or held by a drain")

    @admin.action(description="Delete (events are never registered)…", permissions=["remove"])
    def delete_outbox_rows(self, request, queryset):
        """Two steps, like Django's delete_selected: a confirmation page, then the delete of
        exactly the rows that page listed (their ids travel in the form; "select all" is not
        evaluated again, so rows that matched meanwhile are not deleted)."""
        if request.POST.get("confirm") == "yes":
            confirmed = _ids(request.POST.get("confirmed_ids", ""))
            result = outbox.delete_rows(row_ids=confirmed, actor=actor_of(request))
            self.message_user(
                request,
                f"Deleted {result.rows} outbox row(s); {result.outlets_lost} declared outlet(s) "
                "will never be registered as asset events.",
            )
            if result.rows < len(confirmed):
                self.message_user(
                    request,
                    f"{len(confirmed) - result.rows} row(s) were left alone: a drain was working "
                    "on them (or they are gone).",
                    messages.WARNING,
                )
            return None
        rows = list(queryset.only("id", "payload", "parked_at"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Delete outbox rows?",
            "opts": self.opts,
            "rows": rows[:CONFIRM_PREVIEW_ROWS],
            "more": max(0, len(rows) - CONFIRM_PREVIEW_ROWS),
            "row_count": len(rows),
            "outlets_lost": outlets_in(rows),
            "pending_count": sum(1 for row in rows if row.parked_at is None),
            "confirmed_ids": ",".join(str(row.id) for row in rows),
            "first_id": rows[0].id if rows else "",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/assets_app/outbox_delete_confirm.html", context)


@admin.register(AssetDagRunQueue)
class AssetDagRunQueueAdmin(admin.ModelAdmin):
    """ADRQ rows: events a Dag has not consumed yet. Written by the drain, consumed by the
    scheduler; operators may clear them (per Dag and asset, like the DELETE API)."""

    list_display = ("dag", "asset_link", "event", "event_time", "age")
    list_select_related = ("asset", "asset_event")
    list_filter = ("target_dag", ("asset", admin.RelatedOnlyFieldListFilter))
    search_fields = ("target_dag__dag_id", "asset__name", "asset__uri")
    ordering = ("target_dag_id", "asset_event_id")
    show_full_result_count = False
    actions = ("clear_selected_pairs",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_clear_permission(self, request):
        return request.user.has_perm("assets_app.delete_assetdagrunqueue")

    @admin.display(description="Dag", ordering="target_dag_id")
    def dag(self, obj):
        url = reverse("admin:assets_app_dag_queued_events", args=[obj.target_dag_id])
        return format_html('<a href="{}">{}</a>', url, obj.target_dag_id)

    @admin.display(description="asset", ordering="asset__name")
    def asset_link(self, obj):
        return admin_link(obj.asset, obj.asset.name)

    @admin.display(description="event", ordering="asset_event_id")
    def event(self, obj):
        return admin_link(obj.asset_event, f"#{obj.asset_event_id}")

    @admin.display(description="event time", ordering="asset_event__timestamp")
    def event_time(self, obj):
        return obj.asset_event.timestamp

    @admin.display(description="waiting for", ordering="created_at")
    def age(self, obj):
        return duration(timezone.now() - obj.created_at)

    @admin.action(
        description="Clear queued events of the selected rows' Dag and asset pairs",
        permissions=["clear"],
    )
    def clear_selected_pairs(self, request, queryset):
        pairs = sorted(set(queryset.values_list("target_dag_id", "asset_id")))
        cleared = sum(
            queued_events.clear_queued_events(
                dag_id=dag_id, asset_id=asset_id, actor=actor_of(request)
            )
            for dag_id, asset_id in pairs
        )
        self.message_user(
            request,
            f"Cleared {cleared} queued event(s) across {len(pairs)} Dag/asset pair(s) "
            "(every waiting event of each pair, as DELETE …/assets/{id}/queuedEvents does).",
        )
