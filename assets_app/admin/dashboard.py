"""The operator dashboard (an admin view) and the read-only metric tables behind it."""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, Min
from django.template.response import TemplateResponse
from django.utils import timezone

from ..models import (
    AssetDagRunQueue,
    AssetEventQueue,
    ComponentHeartbeat,
    FreshnessPolicy,
    MetricCounter,
    WatcherMessage,
    WebhookDelivery,
)
from ..operations import metrics, observability, retention
from ..sql import replica
from .base import ReadOnlyAdmin, changelist_url, duration, pretty_json, relative

CHART_WIDTH = 520
CHART_HEIGHT = 170
CHART_LEFT = 40  # room for the y-axis labels
CHART_BOTTOM = 20  # room for the x-axis labels
TOP_WAITING_DAGS = 8


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    value: int
    label: str


def bar_chart(values: list[int], labels: list[str]) -> dict:
    """Geometry of a server-rendered SVG bar chart (one bar per minute, oldest left)."""
    plot_width = CHART_WIDTH - CHART_LEFT - 8
    plot_height = CHART_HEIGHT - CHART_BOTTOM - 8
    top = max(values, default=0)
    scale_max = _nice_ceiling(top)
    slot = plot_width / max(len(values), 1)
    bars = []
    for i, (value, label) in enumerate(zip(values, labels, strict=True)):
        height = plot_height * value / scale_max if scale_max else 0
        bars.append(
            Bar(
                x=round(CHART_LEFT + i * slot + 1, 1),
                y=round(8 + plot_height - height, 1),
                width=round(max(slot - 2, 1), 1),
                height=round(height, 1),
                value=value,
                label=label,
            )
        )
    n = len(values)
    ticks = [
        {
            "x": round(CHART_LEFT + (n - m + 0.5) * slot, 1),
            "label": f"-{m} min" if m > 1 else "now",
        }
        for m in (60, 45, 30, 15, 1)
        if m <= n
    ]
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "left": CHART_LEFT,
        "plot_top": 8,
        "plot_bottom": 8 + plot_height,
        "plot_right": CHART_WIDTH - 8,
        "mid_y": 8 + plot_height / 2,
        "scale_max": scale_max,
        "scale_mid": scale_max / 2 if scale_max % 2 else scale_max // 2,
        "bars": bars,
        "ticks": ticks,
        "total": sum(values),
        "last5": sum(values[-5:]),
        "peak": top,
    }


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above `value` (0 stays 0)."""
    if value <= 0:
        return 0
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def _bound(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return f"> {observability.LATENCY_BUCKETS[-1]:g} s"
    return f"≤ {seconds * 1000:g} ms" if seconds < 1 else f"≤ {seconds:g} s"


def dashboard_view(request):
    """Queue gauges, activity of the last hour, component health: a fixed number of queries."""
    now = timezone.now()
    gauges = observability.queue_gauges(now=now)
    activity = observability.activity_per_minute(now=now)
    labels = [f"{a.minute:%H:%M}" for a in activity]
    health = observability.component_health(now=now)
    latency = observability.latency_histograms()
    waiting: list[dict[str, Any]] = [
        {**row, "oldest_age": duration(now - row["oldest"])}
        for row in AssetDagRunQueue.objects.values("target_dag_id")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by("-n", "target_dag_id")[:TOP_WAITING_DAGS]
    ]
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "now": now,
        "gauges": gauges,
        "oldest_age": duration(timedelta(seconds=gauges.oldest_pending_age_seconds))
        if gauges.depth
        else "-",
        "events_chart": bar_chart([a.events for a in activity], labels),
        "runs_chart": bar_chart([a.triggered_runs for a in activity], labels),
        "health": [
            {
                "c": c,
                "last_run": relative(c.last_run_at, now=now),
                "last_ok": relative(c.last_ok_at, now=now),
            }
            for c in health
        ],
        "counters": metrics.values(),
        "api_requests": sum(series.count for series in latency),
        "api_p50": _bound(observability.latency_quantile(latency, 0.5)),
        "api_p99": _bound(observability.latency_quantile(latency, 0.99)),
        "waiting": waiting,
        "errors": observability.newest_errors(),
        "retention": _retention_line(now),
        "events_out": observability.events_out_gauges(now=now),
        "late_assets_url": changelist_url(FreshnessPolicy, state="late"),
        "webhooks_url": changelist_url(WebhookDelivery, state="pending"),
        "watchers": [
            {
                "g": g,
                "checked": duration(timedelta(seconds=g.depth_age_seconds))
                if g.depth_age_seconds is not None
                else None,
                "parked_url": changelist_url(
                    WatcherMessage, state="parked", watcher__id__exact=g.watcher_id
                ),
            }
            for g in observability.watcher_gauges(now=now)
        ],
        "tz_name": timezone.get_current_timezone_name(),
        "links": {
            "parked": changelist_url(AssetEventQueue, status="parked"),
            "due": changelist_url(AssetEventQueue, status="due"),
            "backing_off": changelist_url(AssetEventQueue, status="backing_off"),
            "pending": changelist_url(AssetEventQueue, status="pending"),
            "queued": changelist_url(AssetDagRunQueue),
        },
        "health_max_age": duration(observability.health_max_age()),
        "replica": replica.status() if replica.configured() else None,
    }
    return TemplateResponse(request, "admin/assets_app/dashboard.html", context)


def _retention_line(now) -> dict[str, Any]:
    """What the last retention clean deleted, per table, or its error (issue 30)."""
    last = observability.last_retention_clean()
    deleted = {
        k: v for k, v in last.detail.items() if k not in (*retention.SUMMARY_FIELDS, "error")
    }
    return {
        "last": last,
        "ago": relative(last.at, now=now) if last.at else "never",
        "deleted": last.detail.get("deleted", 0),
        "tables": sorted(deleted.items()),
        "complete": last.detail.get("complete", True),
    }


@admin.register(MetricCounter)
class MetricCounterAdmin(ReadOnlyAdmin):
    list_display = ("name", "shard", "value")
    list_filter = ("name",)
    search_fields = ("name",)
    ordering = ("name", "shard")


@admin.register(ComponentHeartbeat)
class ComponentHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("component", "last_run_at", "last_ok_at", "last_run_ago")
    readonly_fields = ("detail_json",)
    fields = ("component", "last_run_at", "last_ok_at", "detail_json")

    @admin.display(description="last run")
    def last_run_ago(self, obj):
        return relative(obj.last_run_at)

    @admin.display(description="detail")
    def detail_json(self, obj):
        return pretty_json(obj.detail)
