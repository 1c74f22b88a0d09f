"""Backfills (issue 24): what each one planned and started; pause, unpause and cancel call the
same domain functions as the command line and the public API (`backfills`), audited."""

from django.contrib import admin, messages

from ..guards import exceptions
from ..models import Backfill, BackfillDagRun
from ..scheduling import backfills
from .base import LinkTableAdmin, ReadOnlyAdmin, actor_of


class PlannedRunInline(admin.TabularInline):
    model = BackfillDagRun
    fields = ("sort_ordinal", "logical_date", "dag_run", "started_at", "exception_reason")
    readonly_fields = fields
    ordering = ("sort_ordinal",)
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False


@admin.register(Backfill)
class BackfillAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "dag",
        "from_date",
        "to_date",
        "reprocess_behavior",
        "max_active_runs",
        "is_paused",
        "created_at",
        "completed_at",
    )
    list_filter = ("is_paused", "reprocess_behavior")
    search_fields = ("dag__dag_id",)
    inlines = (PlannedRunInline,)
    actions = ("pause", "unpause", "cancel")

    def has_change_permission(self, request, obj=None):
        # The actions need it; the change page itself stays read-only (every field below).
        return request.user.has_perm("assets_app.change_backfill")

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Backfill._meta.fields]

    def _each(self, request, queryset, change, verb):
        done = 0
        for backfill_id in queryset.values_list("pk", flat=True):
            try:
                change(backfill_id, actor_of(request))
                done += 1
            except exceptions.DomainError as exc:
                self.message_user(
                    request, f"backfill {backfill_id}: {exc.message}", messages.WARNING
                )
        self.message_user(request, f"{verb} {done} backfill(s)")

    @admin.action(description="Pause the selected backfills", permissions=["change"])
    def pause(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda pk, actor: backfills.set_paused(backfill_id=pk, is_paused=True, actor=actor),
            "paused",
        )

    @admin.action(description="Unpause the selected backfills", permissions=["change"])
    def unpause(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda pk, actor: backfills.set_paused(backfill_id=pk, is_paused=False, actor=actor),
            "unpaused",
        )

    @admin.action(description="Cancel the selected backfills", permissions=["change"])
    def cancel(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda pk, actor: backfills.cancel(backfill_id=pk, actor=actor),
            "cancelled",
        )


@admin.register(BackfillDagRun)
class BackfillDagRunAdmin(LinkTableAdmin):
    list_display = ("backfill", "sort_ordinal", "logical_date", "dag_run", "started_at")
    list_select_related = ("backfill", "dag_run")
    list_filter = ("exception_reason",)
