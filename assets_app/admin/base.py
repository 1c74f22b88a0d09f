"""Building blocks shared by the admin modules: read-only model admins and display helpers."""

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.paginator import Paginator
from django.db.models import Count, IntegerField, Model, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from ..guards import limits
from ..models import Dag, DagRunState, TIState
from ..operations import audit
from ..sql import estimates

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


class UuidSearchMixin:
    """A search term that is a UUID finds its row by `uuid_search_field` = that UUID, through
    the field's index (issue 48). Django's `=field` search compares `UPPER(field::text)`, which
    no index serves: on 3 M TIs every search by id read the whole table, twice (count and page).
    Any other term searches `search_fields` as usual, or finds nothing when `uuid_search_only`."""

    uuid_search_field = "id"
    uuid_search_only = False

    def get_search_results(self, request, queryset, search_term):
        try:
            value = uuid.UUID(search_term.strip())
        except ValueError:
            if self.uuid_search_only and search_term.strip():
                return queryset.none(), False
            return super().get_search_results(request, queryset, search_term)  # type: ignore[misc]
        return queryset.filter(**{self.uuid_search_field: value}), False


# The GET parameter of a list's "count exactly" link (EstimatedCountMixin).
EXACT_COUNT_VAR = "exact_count"


class EstimatedCountPaginator(Paginator):
    """A paginator that, for an unfiltered list (no search, no filter) of a table the planner
    estimates at more than `estimate_above` rows, takes that estimate as its count instead of
    COUNT(*) over the table, and says so (`estimated`). A filtered or searched list, a small
    table, `exact=True`, or no estimate (SQLite, a table never analyzed) counts exactly."""

    def __init__(self, *args: Any, exact: bool = False, estimate_above: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.exact = exact
        self.estimate_above = estimate_above
        self.estimated = False

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if not self.exact and query is not None and not query.where:
            estimate = estimates.estimated_rows(query.model)
            if estimate is not None and estimate > self.estimate_above:
                self.estimated = True
                return estimate
        return super().count


class EstimatedCountMixin:
    """A list whose plain load does not count a big table (issue 48): EstimatedCountPaginator,
    its "about N" shown as an estimate (templates/admin/pagination.html) with a link that
    counts exactly (`?exact_count=1`); a filtered list counts its own rows only, not the whole
    table beside them (`show_full_result_count`)."""

    show_full_result_count = False
    # Below this many rows COUNT(*) is cheap and exact; above it a plain load estimates.
    count_estimate_above = 100_000

    def changelist_view(self, request, extra_context=None):
        if EXACT_COUNT_VAR in request.GET:
            # Not a lookup: the ChangeList would refuse an unknown parameter.
            request.GET = request.GET.copy()
            del request.GET[EXACT_COUNT_VAR]
            request.exact_count = True
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        return EstimatedCountPaginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            exact=getattr(request, "exact_count", False),
            estimate_above=self.count_estimate_above,
        )


def dag_id_filter(field: str, title: str) -> type[admin.SimpleListFilter]:
    """A list filter on the Dag-id column `field` (issue 48) whose choices are the Dag table's
    ids, one indexed read, where Django's field filter lists `SELECT DISTINCT field` over the
    filtered table itself (3 M TIs, 2 M events). Its parameter is the field filter's own
    (`field__exact`), so links into a filtered list keep working; an id no Dag has any more
    still filters by URL, it is only not offered."""

    class DagIdFilter(admin.SimpleListFilter):
        parameter_name = f"{field}__exact"

        def lookups(self, request, model_admin):
            dag_ids = Dag.objects.order_by("dag_id").values_list("dag_id", flat=True)
            return [(dag_id, dag_id) for dag_id in dag_ids]

        def queryset(self, request, queryset):
            if self.value() is None:
                return queryset
            return queryset.filter(**{field: self.value()})

    DagIdFilter.title = title
    return DagIdFilter


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
