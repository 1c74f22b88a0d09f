"""Queue watchers (issue 28): a watcher with its routes (inline), the messages it took with a
parked filter, and the requeue action (route parked messages again after a rule changed).

Saving a watcher goes through `watchers.save_watcher`, one durable transaction that audits the
configuration before and after; deleting through `watchers.delete_watchers`."""

import json

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils.html import format_html, format_html_join

from ..guards import masking
from ..models import MessageState, QueueWatcher, WatcherMessage, WatcherRoute
from ..watchers import messages as watchers
from .base import LinkTableAdmin, ReadOnlyAdmin, actor_of


def count_of(queryset: QuerySet) -> Subquery:
    return Subquery(
        queryset.order_by().values("watcher").annotate(n=Count("id")).values("n"),
        output_field=IntegerField(),
    )


class RouteInline(admin.TabularInline):
    """The operator's routes (made here)."""

    model = WatcherRoute
    extra = 1
    fields = ("routing_key_pattern", "body_field", "body_value", "assets")
    autocomplete_fields = ("assets",)
    verbose_name_plural = "routes made here"

    def get_queryset(self, request):
        return super().get_queryset(request).filter(dag__isnull=True)


@admin.register(QueueWatcher)
class QueueWatcherAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "queue",
        "enabled",
        "from_definitions",
        "prefetch",
        "routes_count",
        "parked_count",
        "queue_depth",
        "depth_checked_at",
    )
    list_filter = ("enabled", "from_definitions")
    search_fields = ("name", "queue")
    fields = ("name", "broker_url", "queue", "enabled", "prefetch")
    readonly_fields = (
        "from_definitions",
        "declared_routes",
        "queue_depth",
        "depth_checked_at",
        "created_at",
        "updated_at",
    )
    inlines = (RouteInline,)
    actions = ("delete_selected_watchers",)

    def get_fields(self, request, obj=None):
        fields = [*self.fields, *self.readonly_fields] if obj else list(self.fields)
        if obj is not None and not self.has_change_permission(request, obj):
            # Issue 38: a view-only operator sees the broker URL without its password.
            fields = ["broker_url_masked" if f == "broker_url" else f for f in fields]
        return fields

    @admin.display(description="broker url")
    def broker_url_masked(self, obj: QueueWatcher) -> str:
        return masking.url_without_password(obj.broker_url) if obj.broker_url else ""

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and not self.has_change_permission(request, obj):
            return ("broker_url_masked", *self.readonly_fields)
        if obj is not None and obj.from_definitions:
            # The definitions' watcher: its name, queue and broker are theirs (the next sync
            # would put them back); enabled and prefetch are the operator's.
            return ("name", "broker_url", "queue", *self.readonly_fields)
        return self.readonly_fields

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # through `watchers.delete_watchers`, audited
        return actions

    def get_queryset(self, request):
        parked = WatcherMessage.objects.filter(watcher=OuterRef("pk"), state=MessageState.PARKED)
        routes = WatcherRoute.objects.filter(watcher=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_parked=Coalesce(count_of(parked), 0), n_routes=Coalesce(count_of(routes), 0)
            )
        )

    @admin.display(description="routes declared by Dag definitions")
    def declared_routes(self, obj) -> str:
        """The routes Dag definitions declared (their `watchers`; Airflow AssetWatchers): shown,
        not edited here; the next sync of a Dag makes its routes what its definition says."""
        rows = [
            (r.dag_id, str(r), ", ".join(sorted(a.name for a in r.assets.all())))
            for r in obj.routes.filter(dag__isnull=False).prefetch_related("assets")
        ]
        if not rows:
            return "-"
        return format_html(
            "<ul>{}</ul>",
            format_html_join("", "<li>dag {}: {} &rarr; {}</li>", rows),
        )

    @admin.display(description="routes", ordering="n_routes")
    def routes_count(self, obj) -> int:
        return obj.n_routes

    @admin.display(description="parked", ordering="n_parked")
    def parked_count(self, obj) -> int:
        return obj.n_parked

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Saving is `watchers.save_watcher`'s durable transaction, not the admin's atomic().
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def save_model(self, request, obj, form, change):
        pass  # with the routes, in save_related

    def save_related(self, request, form, formsets, change):
        def write() -> QueueWatcher:
            watcher = form.save()
            for formset in formsets:
                formset.instance = watcher
                self.save_formset(request, form, formset, change=change)
            return watcher

        watchers.save_watcher(
            write=write, watcher_id=form.instance.pk if change else None, actor=actor_of(request)
        )

    def delete_model(self, request, obj):
        watchers.delete_watchers(ids=[obj.pk], actor=actor_of(request))

    @admin.action(
        description="Delete the selected watchers (and their message records)",
        permissions=["delete"],
    )
    def delete_selected_watchers(self, request, queryset):
        n = watchers.delete_watchers(
            ids=list(queryset.values_list("id", flat=True)), actor=actor_of(request)
        )
        messages.success(request, f"Deleted {n} watcher(s).")


class ParkedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(MessageState.PARKED, "parked"), (MessageState.REGISTERED, "registered")]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(state=self.value())
        return queryset


@admin.register(WatcherMessage)
class WatcherMessageAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "watcher",
        "message_id",
        "state_badge",
        "reason",
        "routing_key",
        "received_at",
        "requeues",
    )
    list_filter = (ParkedFilter, "reason", "watcher")
    search_fields = ("=message_id", "routing_key")
    list_select_related = ("watcher",)
    show_full_result_count = False
    actions = ("requeue",)
    fields = (
        "watcher",
        "message_id",
        "message_id_derived",
        "state",
        "reason",
        "detail",
        "routing_key",
        "headers",
        "body_view",
        "event_ids",
        "received_at",
        "registered_at",
        "requeues",
    )
    readonly_fields = fields

    @admin.display(description="state")
    def state_badge(self, obj: WatcherMessage) -> str:
        kind = "parked" if obj.state == MessageState.PARKED else "ok"
        return format_html('<span class="aes-badge aes-badge-{}">{}</span>', kind, obj.state)

    @admin.display(description="body")
    def body_view(self, obj: WatcherMessage) -> str:
        if obj.body is None:
            return "-"
        raw = bytes(obj.body)
        try:
            text = json.dumps(json.loads(raw), indent=2)
        except ValueError:
            text = raw[:20_000].decode("utf-8", errors="replace")
        return format_html('<pre class="aes-json">{}</pre>', text)

    def has_requeue_permission(self, request):
        return request.user.has_perm("assets_app.change_watchermessage")

    @admin.action(
        description="Requeue (route again under the current rules)", permissions=["requeue"]
    )
    def requeue(self, request, queryset):
        ids = list(queryset.filter(state=MessageState.PARKED).values_list("id", flat=True))
        result = watchers.requeue_parked(ids=ids, actor=actor_of(request))
        done = len(result.registered) + len(result.still_parked)
        self.message_user(
            request,
            f"{len(result.registered)} registered, {len(result.still_parked)} still parked.",
        )
        if len(ids) > done:
            self.message_user(
                request,
                f"{len(ids) - done} left alone: another requeue held them, or no longer parked.",
                messages.WARNING,
            )


@admin.register(WatcherRoute)
class WatcherRouteAdmin(LinkTableAdmin):
    """Edited inline on their watcher's page; listed here only by URL."""

    list_display = ("id", "watcher", "routing_key_pattern", "body_field", "body_value")
    list_select_related = ("watcher",)
