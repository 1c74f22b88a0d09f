"""Dag callback requests (issue 39), read-only: each run finish of a Dag with
`on_success_callback` / `on_failure_callback`, whether `bin/airflow-worker` ran it (success),
a callback raised (failed, with its traceback) or it was parked (claimed
`DAG_CALLBACK_MAX_ATTEMPTS` times without a report: its workers died). The filters find the
failed and parked ones."""

from django.contrib import admin
from django.utils.html import format_html

from ..models import DagCallbackRequest
from .base import ReadOnlyAdmin


@admin.register(DagCallbackRequest)
class DagCallbackRequestAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "dag_id",
        "run",
        "callback",
        "reason",
        "state",
        "attempts",
        "claimed_by",
        "created_at",
        "finished_at",
        "error",
    )
    list_filter = ("state", "is_failure_callback")
    list_select_related = ("dag_run",)
    search_fields = ("=dag__dag_id",)
    ordering = ("-id",)
    readonly_fields = (
        "dag_id",
        "run",
        "clear_number",
        "callback",
        "reason",
        "last_ti_id",
        "state",
        "attempts",
        "claimed_by",
        "lease_until",
        "created_at",
        "finished_at",
        "error_text",
    )
    fields = readonly_fields

    @admin.display(description="run")
    def run(self, obj: DagCallbackRequest) -> str:
        return obj.dag_run.run_id

    @admin.display(description="callback")
    def callback(self, obj: DagCallbackRequest) -> str:
        return "on_failure_callback" if obj.is_failure_callback else "on_success_callback"

    @admin.display(description="error")
    def error(self, obj: DagCallbackRequest) -> str:
        lines = obj.last_error.strip().splitlines()
        return format_html('<span class="aes-clip">{}</span>', lines[-1] if lines else "")

    @admin.display(description="error")
    def error_text(self, obj: DagCallbackRequest) -> str:
        return format_html('<pre class="aes-json">{}</pre>', obj.last_error)
