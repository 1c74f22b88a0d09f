"""Building blocks shared by the admin modules: read-only model admins and display helpers."""

from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Count, IntegerField, Model, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from ..guards import limits
from ..models import DagRunState, TIState
from ..operations import audit

# Run and TI states as colours, one mapping over the state values (Airflow's palette, roughly).
# A state not listed here (a new TIState) is drawn in NEUTRAL_COLOUR, so nothing breaks.
STATE_COLOURS: dict[str, str] = {
    TIState.SCHEDULED: "#d6d3d1",
    TIState.QUEUED: "#78716c",
    TIState.RUNNING: "#2563eb",
    TIState.SUCCESS: "#16a34a",
    TIState.FAILED: "#dc2626",
    TIState.UP_FOR_RETRY: "#d97706",
    TIState.SKIPPED: "#db2777",
    TIState.REMOVED: "#9ca3af",
    TIState.UPSTREAM_FAILED: "#ea580c",
    TIState.DEFERRED: "#9370db",  # Airflow's mediumpurple
    TIState.AWAITING_INPUT: "#ff8c00",  # Airflow's darkorange
    DagRunState.QUEUED: "#78716c",
    DagRunState.RUNNING: "#2563eb",
    DagRunState.SUCCESS: "#16a34a",
    DagRunState.FAILED: "#dc2626",
}
NEUTRAL_COLOUR = "#a8a29e"


def state_colour(state: str | None) -> str:
    return STATE_COLOURS.get(state or "", NEUTRAL_COLOUR)


def state_badge(state: str | None) -> str:
    label = (state or "no status").replace("_", " ")
    return format_html(
        '<span class="aes-badge aes-state-badge" data-state="{}" style="background:{}">{}</span>',
        state or "",
        state_colour(state),
        label,
    )


def run_duration(start: datetime | None, end: datetime | None, *, now: datetime) -> str:
    """`42 s`; `12 s so far` while running; `-` before it started."""
    if start is None:
        return "-"
    return duration((end or now) - start) + ("" if end else " so far")


class ReadOnlyAdmin(admin.ModelAdmin):
    """For append-only tables: operators may look, never add, edit or delete."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class LinkTableAdmin(ReadOnlyAdmin):
    """A join table (task -> asset, Dag -> asset, ...): reachable from the pages that show its
    links and by URL, but not listed on the index, where it would only crowd what operators use."""

    def has_module_permission(self, request):
        return False


def actor_of(request) -> audit.Actor:
    """The logged-in operator as the audit trail's actor."""
    return audit.Actor.from_user(request.user, via="admin")


def duration(delta: timedelta) -> str:
    """`42 s`, `7 min`, `3 h 5 min`, `2 d 4 h`: short enough for a changelist column."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def relative(moment: datetime | None, *, now: datetime | None = None) -> str:
    """`in 3 min` / `5 s ago` / `now`; `-` for no time."""
    if moment is None:
        return "-"
    delta = moment - (now or timezone.now())
    if abs(delta) < timedelta(seconds=1):
        return "now"
    return f"in {duration(delta)}" if delta > timedelta(0) else f"{duration(delta)} ago"


def count_of(model: type[Model], fk: str, **filters: Any) -> Coalesce:
    """A correlated COUNT subquery over `model` rows pointing at the outer row through `fk`.

    Evaluated only for the rows of the page (unlike a GROUP BY join), so a changelist keeps one
    query for its rows however large the related tables are.
    """
    counted = (
        model._default_manager.filter(**{fk: OuterRef("pk")}, **filters)
        .order_by()
        .values(fk)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def admin_link(obj: Model | None, text: Any = None, *, pk: Any = None, model=None) -> str:
    """A link to an object's admin change page (by instance, or by model and pk)."""
    if pk is None:
        if obj is None:
            raise ValueError("admin_link needs an object or a pk")
        pk = obj.pk
    model = model or type(obj)
    opts = model._meta
    # quote(): the change view unquotes its path, so an id like `etl_2024` ("_20") must go quoted.
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(pk)])
    return format_html('<a href="{}">{}</a>', url, obj if text is None else text)


def changelist_url(model: type[Model], **query: Any) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    if query:
        from urllib.parse import urlencode

        url += "?" + urlencode(query)
    return url


def pretty_json(value: Any) -> str:
    return format_html('<pre class="aes-json">{}</pre>', limits.display_json(value, indent=2))


def first_line(text: str, limit: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
