"""Building blocks shared by the admin modules: read-only model admins and display helpers."""

import json
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, IntegerField, Model, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import audit


class ReadOnlyAdmin(admin.ModelAdmin):
    """For append-only tables: operators may look, never add, edit or delete."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
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
        model.objects.filter(**{fk: OuterRef("pk")}, **filters)
        .order_by()
        .values(fk)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def admin_link(obj: Model | None, text: Any = None, *, pk: Any = None, model=None) -> str:
    """A link to an object's admin change page (by instance, or by model and pk)."""
    model = model or type(obj)
    pk = pk if pk is not None else obj.pk
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk])
    return format_html('<a href="{}">{}</a>', url, obj if text is None else text)


def changelist_url(model: type[Model], **query: Any) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    if query:
        from urllib.parse import urlencode

        url += "?" + urlencode(query)
    return url


def pretty_json(value: Any) -> str:
    return format_html(
        '<pre class="aes-json">{}</pre>', json.dumps(value, indent=2, sort_keys=True)
    )


def first_line(text: str, limit: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
