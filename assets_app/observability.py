"""What operators watch: queue gauges, activity per minute, component health, the worker API
latency histogram, and their Prometheus text rendering (`/metrics`).

Everything here reads the database (gauges are computed per scrape with a fixed number of
queries; counters and the histogram live in the sharded `MetricCounter` rows of `metrics.py`), so
every API process and django-q2 cluster contributes and any process can answer a scrape.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from . import metrics
from .models import (
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    ComponentHeartbeat,
    DagRun,
    DagRunType,
    MetricCounter,
)

PREFIX = "asset_service_"
COMPONENTS = ("drain", "scheduler")

# Upper bounds (seconds) of the worker API latency histogram; +Inf is implied.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# MetricCounter names of the histogram: "<LATENCY_KEY>|<method>|<route>|<bucket index or sum_us>".
LATENCY_KEY = "api_latency"
_NAME_MAX = MetricCounter._meta.get_field("name").max_length


@dataclass(frozen=True)
class QueueGauges:
    depth: int  # outbox rows not parked (due or backing off)
    due: int  # not parked and next_attempt_at <= now
    backing_off: int  # not parked, failed at least once, next attempt in the future
    parked: int
    oldest_pending_age_seconds: float  # age of the oldest unparked row; 0 when there is none
    queued_events: int  # ADRQ rows waiting for a scheduler


def queue_gauges(*, now: datetime | None = None) -> QueueGauges:
    """The outbox and ADRQ gauges. Two aggregate queries, no locks."""
    now = now or timezone.now()
    pending = Q(parked_at__isnull=True)
    row = AssetEventQueue.objects.aggregate(
        depth=Count("id", filter=pending),
        due=Count("id", filter=pending & Q(next_attempt_at__lte=now)),
        backing_off=Count("id", filter=pending & Q(next_attempt_at__gt=now) & Q(attempts__gt=0)),
        parked=Count("id", filter=Q(parked_at__isnull=False)),
        oldest=Min("created_at", filter=pending),
    )
    oldest = row["oldest"]
    return QueueGauges(
        depth=row["depth"],
        due=row["due"],
        backing_off=row["backing_off"],
        parked=row["parked"],
        oldest_pending_age_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
        queued_events=AssetDagRunQueue.objects.count(),
    )


@dataclass(frozen=True)
class MinuteActivity:
    minute: datetime
    events: int
    triggered_runs: int


def activity_per_minute(*, now: datetime | None = None, minutes: int = 60) -> list[MinuteActivity]:
    """Asset events registered and asset-triggered runs created in each of the last `minutes`
    whole minutes (oldest first, the current minute last). Two grouped queries."""
    now = now or timezone.now()
    last = now.replace(second=0, microsecond=0)
    first = last - timedelta(minutes=minutes - 1)
    events = dict(
        AssetEvent.objects.filter(timestamp__gte=first)
        .annotate(minute=TruncMinute("timestamp"))
        .values_list("minute")
        .annotate(n=Count("id"))
        .order_by()
    )
    runs = dict(
        DagRun.objects.filter(run_type=DagRunType.ASSET_TRIGGERED, created_at__gte=first)
        .annotate(minute=TruncMinute("created_at"))
        .values_list("minute")
        .annotate(n=Count("id"))
        .order_by()
    )
    slots = [first + timedelta(minutes=i) for i in range(minutes)]
    return [MinuteActivity(m, events.get(m, 0), runs.get(m, 0)) for m in slots]


@dataclass(frozen=True)
class ComponentHealth:
    component: str
    last_run_at: datetime | None
    last_ok_at: datetime | None
    detail: dict
    healthy: bool
    status: str  # "ok" | "failing" | "stale" | "never seen"
    # Healthy but not clean: the drain's last run failed or parked rows.
    warning: str = ""


def health_max_age() -> timedelta:
    return timedelta(seconds=settings.ASSET_HEALTH_MAX_AGE_SECONDS)


def component_health(*, now: datetime | None = None) -> list[ComponentHealth]:
    """Drain and scheduler: healthy when their last successful run is recent enough
    (`ASSET_HEALTH_MAX_AGE_SECONDS`; the django-q2 sweep runs them every minute). One query."""
    now = now or timezone.now()
    cutoff = now - health_max_age()
    beats = {b.component: b for b in ComponentHeartbeat.objects.filter(component__in=COMPONENTS)}
    result = []
    for name in COMPONENTS:
        beat = beats.get(name)
        if beat is None:
            result.append(ComponentHealth(name, None, None, {}, False, "never seen"))
            continue
        ok_recently = beat.last_ok_at is not None and beat.last_ok_at >= cutoff
        if ok_recently:
            status = "ok"
        elif beat.last_run_at >= cutoff:
            status = "failing"
        else:
            status = "stale"
        detail = beat.detail or {}
        warning = ""
        if name == "drain" and (detail.get("failed") or detail.get("parked")):
            warning = (
                f"its last run failed {detail.get('failed', 0)} row(s), "
                f"parked {detail.get('parked', 0)}"
            )
        result.append(
            ComponentHealth(
                name, beat.last_run_at, beat.last_ok_at, detail, ok_recently, status, warning
            )
        )
    return result


@dataclass(frozen=True)
class RecentError:
    row_id: int
    dag_id: str
    task_id: str
    at: datetime
    kind: str
    error: str
    parked: bool


def newest_errors(*, limit: int = 5) -> list[RecentError]:
    """The outbox rows that failed most recently, newest first. One query."""
    rows = (
        AssetEventQueue.objects.exclude(last_error="")
        .order_by("-updated_at", "-id")
        .values_list(
            "id",
            "source_dag_id",
            "source_task_id",
            "updated_at",
            "last_error_kind",
            "last_error",
            "parked_at",
        )[:limit]
    )
    return [
        RecentError(
            row_id=row_id,
            dag_id=dag_id,
            task_id=task_id,
            at=at,
            kind=kind or "",
            error=next((line for line in error.splitlines() if line.strip()), "")[:200],
            parked=parked_at is not None,
        )
        for row_id, dag_id, task_id, at, kind, error, parked_at in rows
    ]


def database_reachable() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        return False


# --- worker API latency histogram ---------------------------------------------------------


def _latency_name(method: str, route: str, suffix: str) -> str:
    head = f"{LATENCY_KEY}|{method}|"
    tail = f"|{suffix}"
    return head + route[: _NAME_MAX - len(head) - len(tail)] + tail


def _write_latency(method: str, route: str, seconds: float) -> None:
    bucket = bisect.bisect_left(LATENCY_BUCKETS, seconds)  # len(LATENCY_BUCKETS) means +Inf
    table = MetricCounter._meta.db_table
    shard = os.getpid() % metrics.SHARDS
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, shard, value) VALUES (%s, %s, 1), (%s, %s, %s) "
            f"ON CONFLICT (name, shard) DO UPDATE SET value = {table}.value + excluded.value",
            [
                _latency_name(method, route, str(bucket)),
                shard,
                _latency_name(method, route, "sum_us"),
                shard,
                round(seconds * 1_000_000),
            ],
        )


def record_api_latency(*, method: str, route: str, seconds: float) -> None:
    """Count one worker API request in the latency histogram: one upsert of two counter rows,
    after the current transaction commits (immediately in autocommit), like `metrics.incr`."""
    transaction.on_commit(lambda: _write_latency(method, route, seconds))


@dataclass(frozen=True)
class LatencySeries:
    method: str
    route: str
    buckets: tuple[int, ...]  # per bucket (not cumulative), the last one is +Inf
    sum_seconds: float

    @property
    def count(self) -> int:
        return sum(self.buckets)


def latency_histograms() -> list[LatencySeries]:
    """The histogram series summed over shards, sorted by (route, method). One query."""
    rows = (
        MetricCounter.objects.filter(name__startswith=f"{LATENCY_KEY}|")
        .values_list("name")
        .annotate(total=Sum("value"))
        .order_by()
    )
    buckets: dict[tuple[str, str], list[int]] = defaultdict(
        lambda: [0] * (len(LATENCY_BUCKETS) + 1)
    )
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for name, total in rows:
        _, method, rest = name.split("|", 2)
        route, suffix = rest.rsplit("|", 1)
        if suffix == "sum_us":
            sums[(method, route)] += int(total)
        else:
            buckets[(method, route)][int(suffix)] += int(total)
    keys = sorted(set(buckets) | set(sums), key=lambda k: (k[1], k[0]))
    return [
        LatencySeries(
            method=m,
            route=r,
            buckets=tuple(buckets[(m, r)]),
            sum_seconds=sums[(m, r)] / 1_000_000,
        )
        for m, r in keys
    ]


def latency_quantile(series: list[LatencySeries], q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding the q-quantile of all series together;
    `inf` past the last bound, None without requests. A histogram only bounds a quantile."""
    totals = [sum(column) for column in zip(*(s.buckets for s in series), strict=True)]
    count = sum(totals)
    if not count:
        return None
    cumulative = 0
    for bound, n in zip((*LATENCY_BUCKETS, float("inf")), totals, strict=True):
        cumulative += n
        if cumulative >= q * count:
            return bound
    return float("inf")


# --- Prometheus text format -----------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}", *samples]


def render_prometheus(*, now: datetime | None = None) -> str:
    """The `/metrics` body (text exposition format 0.0.4). A fixed number of queries."""
    now = now or timezone.now()
    gauges = queue_gauges(now=now)
    lines: list[str] = []
    for name, value, help_text in (
        ("outbox_depth", gauges.depth, "Outbox rows waiting for registration (not parked)."),
        ("outbox_due", gauges.due, "Outbox rows due for a drain attempt now."),
        ("outbox_backing_off", gauges.backing_off, "Outbox rows waiting for a retry."),
        ("outbox_parked", gauges.parked, "Outbox rows parked after too many failures."),
        (
            "outbox_oldest_pending_age_seconds",
            gauges.oldest_pending_age_seconds,
            "Age of the oldest outbox row not parked.",
        ),
        ("queued_asset_events", gauges.queued_events, "ADRQ rows waiting for the scheduler."),
    ):
        lines += _family(name, "gauge", help_text, [f"{PREFIX}{name} {_number(value)}"])

    for counter, value in metrics.values().items():
        name = f"{counter}_total"
        help_text = f"Total {counter.replace('_', ' ')} since the database was created."
        lines += _family(name, "counter", help_text, [f"{PREFIX}{name} {value}"])

    health = component_health(now=now)
    for metric, attr, help_text in (
        ("component_last_run_timestamp_seconds", "last_run_at", "Last run of a component."),
        ("component_last_ok_timestamp_seconds", "last_ok_at", "Last successful run."),
    ):
        samples = [
            f'{PREFIX}{metric}{{component="{h.component}"}} {getattr(h, attr).timestamp():.3f}'
            for h in health
            if getattr(h, attr) is not None
        ]
        lines += _family(metric, "gauge", help_text, samples)
    lines += _family(
        "component_healthy",
        "gauge",
        "1 when the component succeeded within ASSET_HEALTH_MAX_AGE_SECONDS.",
        [
            f'{PREFIX}component_healthy{{component="{h.component}"}} {int(h.healthy)}'
            for h in health
        ],
    )

    hist = "worker_api_request_duration_seconds"
    samples = []
    for series in latency_histograms():
        labels = f'method="{_escape(series.method)}",route="{_escape(series.route)}"'
        cumulative = 0
        for bound, count in zip((*LATENCY_BUCKETS, None), series.buckets, strict=True):
            cumulative += count
            le = "+Inf" if bound is None else _number(bound)
            samples.append(f'{PREFIX}{hist}_bucket{{{labels},le="{le}"}} {cumulative}')
        samples.append(f"{PREFIX}{hist}_sum{{{labels}}} {series.sum_seconds!r}")
        samples.append(f"{PREFIX}{hist}_count{{{labels}}} {series.count}")
    lines += _family(hist, "histogram", "Worker API (/execution/) request latency.", samples)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Health:
    ok: bool
    database: bool
    components: list[ComponentHealth]


def health(*, now: datetime | None = None) -> Health:
    """Database reachable, and drain and scheduler succeeded recently."""
    if not database_reachable():
        return Health(ok=False, database=False, components=[])
    components = component_health(now=now)
    return Health(ok=all(c.healthy for c in components), database=True, components=components)
