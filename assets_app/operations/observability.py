"""What operators watch: queue gauges, activity per minute, component health, the worker API
latency histogram, and `/metrics`: prometheus_client renders a registry holding a collector of
the database gauges and counters (`DatabaseCollector`) and the histogram.

Gauges are computed per scrape with a fixed number of queries and counters live in the sharded
`MetricCounter` rows of `operations/metrics.py`, so every API process and django-q2 cluster
contributes and any process can answer a scrape. The worker API latency histogram is the exception:
it is only recorded by the web processes, in memory (prometheus_client, see below).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, IntegerField, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..models import (
    AssetDagRunQueue,
    AssetEvent,
    AssetEventQueue,
    ComponentHeartbeat,
    Dag,
    DagRun,
    DagRunType,
    DeliveryState,
    FreshnessPolicy,
    FreshnessState,
    MessageState,
    QueueWatcher,
    WatcherMessage,
    WebhookDelivery,
)
from ..sql import connection as connection_sql
from . import bundles, metrics
from .bundles import UnservedDag

PREFIX = "asset_service_"
# The drain and the asset scheduler (the cluster's sweeps beat every minute) and the timers
# process, whose repair timer beats every TASK_REPAIR_INTERVAL_SECONDS (issue 41: a dead timers
# process shows here, not only as late webhooks and ticks).
COMPONENTS = ("drain", "scheduler", "repair")

# Upper bounds (seconds) of the worker API latency histogram; +Inf is implied.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
class EventsOutGauges:
    """Issue 29: freshness policies by state and webhook messages by state."""

    assets_late: int
    assets_fresh: int
    assets_unknown: int
    webhooks_pending: int
    webhooks_failed: int
    webhooks_oldest_pending_age_seconds: float


def events_out_gauges(*, now: datetime | None = None) -> EventsOutGauges:
    """Freshness and webhook gauges. Two aggregate queries, no locks."""
    now = now or timezone.now()
    policies = FreshnessPolicy.objects.aggregate(
        late=Count("id", filter=Q(state=FreshnessState.LATE)),
        fresh=Count("id", filter=Q(state=FreshnessState.FRESH)),
        unknown=Count("id", filter=Q(state=FreshnessState.UNKNOWN)),
    )
    messages = WebhookDelivery.objects.aggregate(
        pending=Count("id", filter=Q(state=DeliveryState.PENDING)),
        failed=Count("id", filter=Q(state=DeliveryState.FAILED)),
        oldest=Min("created_at", filter=Q(state=DeliveryState.PENDING)),
    )
    oldest = messages["oldest"]
    return EventsOutGauges(
        assets_late=policies["late"],
        assets_fresh=policies["fresh"],
        assets_unknown=policies["unknown"],
        webhooks_pending=messages["pending"],
        webhooks_failed=messages["failed"],
        webhooks_oldest_pending_age_seconds=(
            max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
        ),
    )


_EVENTS_OUT_GAUGES = (
    ("assets_late", "assets_late", "Assets whose freshness policy finds them late."),
    ("assets_fresh", "assets_fresh", "Assets whose freshness policy finds them fresh."),
    ("webhooks_pending", "webhooks_pending", "Webhook messages not delivered yet."),
    ("webhooks_failed", "webhooks_failed", "Webhook messages given up after WEBHOOK_MAX_AGE."),
    (
        "webhooks_oldest_pending_age_seconds",
        "webhooks_oldest_pending_age_seconds",
        "Age of the oldest webhook message not delivered yet; 0 when there is none.",
    ),
)


@dataclass(frozen=True)
class WatcherGauge:
    """Issue 28: one queue watcher as operators watch it. `queue_depth` is the lag: messages
    ready in its queue when a consumer last looked (`depth_age_seconds` ago; None before any
    consumer ran), `per_second` the messages registered over the last minute, per second."""

    watcher_id: int
    name: str
    queue: str
    enabled: bool
    queue_depth: int | None
    depth_age_seconds: float | None
    parked: int
    per_second: float


def _count(queryset: QuerySet) -> Coalesce:
    return Coalesce(
        Subquery(
            queryset.order_by().values("watcher").annotate(n=Count("id")).values("n"),
            output_field=IntegerField(),
        ),
        0,
    )


def watcher_gauges(*, now: datetime | None = None) -> list[WatcherGauge]:
    """Every queue watcher's lag, rate and parked count. One query (two index-backed counts
    per watcher), no locks."""
    now = now or timezone.now()
    mine = WatcherMessage.objects.filter(watcher=OuterRef("pk"))
    rows = QueueWatcher.objects.order_by("name").annotate(
        n_parked=_count(mine.filter(state=MessageState.PARKED)),
        last_minute=_count(mine.filter(registered_at__gte=now - timedelta(seconds=60))),
    )
    return [
        WatcherGauge(
            watcher_id=w.pk,
            name=w.name,
            queue=w.queue,
            enabled=w.enabled,
            queue_depth=w.queue_depth,
            depth_age_seconds=(
                max(0.0, (now - w.depth_checked_at).total_seconds()) if w.depth_checked_at else None
            ),
            parked=w.n_parked,
            per_second=w.last_minute / 60.0,
        )
        for w in rows
    ]


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
    status: str  # "ok" | "starting" | "failing" | "stale" | "never seen"
    # Healthy but not clean: the drain's last run failed or parked rows.
    warning: str = ""


def health_max_age() -> timedelta:
    return timedelta(seconds=settings.ASSET_HEALTH_MAX_AGE_SECONDS)


# When this process started. For ASSET_HEALTH_STARTUP_GRACE_SECONDS after it, /healthz waits for
# the cluster's first sweep: a drain or scheduler not seen since the start is "starting".
_PROCESS_STARTED_AT = timezone.now()


def process_started_at() -> datetime:
    return _PROCESS_STARTED_AT


def _starting(now: datetime) -> bool:
    grace = timedelta(seconds=settings.ASSET_HEALTH_STARTUP_GRACE_SECONDS)
    return now - process_started_at() < grace


def component_health(*, now: datetime | None = None) -> list[ComponentHealth]:
    """Drain, scheduler and the timers' repair: healthy when their last successful run is recent
    enough (`ASSET_HEALTH_MAX_AGE_SECONDS`; the django-q2 sweeps run the first two every minute,
    the timers process the repair every TASK_REPAIR_INTERVAL_SECONDS). Within the
    start-up grace of this process, one never seen, or not run since the start, is "starting"
    and healthy (a run since the start that failed is "failing" at once). One query."""
    now = now or timezone.now()
    cutoff = now - health_max_age()
    starting = _starting(now)
    beats = {b.component: b for b in ComponentHeartbeat.objects.filter(component__in=COMPONENTS)}
    result = []
    for name in COMPONENTS:
        beat = beats.get(name)
        if beat is None:
            status = "starting" if starting else "never seen"
            result.append(ComponentHealth(name, None, None, {}, starting, status))
            continue
        ok_recently = beat.last_ok_at is not None and beat.last_ok_at >= cutoff
        if ok_recently:
            status = "ok"
        elif starting and beat.last_run_at < process_started_at():
            status = "starting"
            ok_recently = True
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
class LastRetentionClean:
    """The last clean of `retention` (its `retention` heartbeat): when, whether it worked, what
    it deleted per table (or its error)."""

    at: datetime | None
    ok: bool
    detail: dict

    @property
    def warning(self) -> str:
        if self.at is None or self.ok:
            return ""
        return str(self.detail.get("error") or "the last clean failed")


RETENTION_COMPONENT = "retention"


def last_retention_clean() -> LastRetentionClean:
    """One query. Never run: `at` None, ok."""
    beat = ComponentHeartbeat.objects.filter(component=RETENTION_COMPONENT).first()
    if beat is None:
        return LastRetentionClean(at=None, ok=True, detail={})
    ok = beat.last_ok_at is not None and beat.last_ok_at >= beat.last_run_at
    return LastRetentionClean(at=beat.last_run_at, ok=ok, detail=beat.detail or {})


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
        return connection_sql.select_one()
    except Exception:
        return False


# --- worker API latency histogram ---------------------------------------------------------
#
# Kept in process memory by prometheus_client, not in the database: recording a request is an
# in-memory (or mmap) increment, no statement. Under gunicorn, PROMETHEUS_MULTIPROC_DIR (set by
# bin/serve, the proof suites and the benchmark harness; prometheus_client reads it when first
# imported) makes every worker write its values to files there, and any worker answering
# /metrics sums all of them. Without it each process reports its own requests.

HISTOGRAM_NAME = f"{PREFIX}worker_api_request_duration_seconds"
_histogram_holder: list[Histogram] = []


def _histogram() -> Histogram:
    if not _histogram_holder:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            os.makedirs(directory, exist_ok=True)
        _histogram_holder.append(
            Histogram(
                HISTOGRAM_NAME,
                "Worker API (/execution/) request latency.",
                ["method", "route"],
                buckets=LATENCY_BUCKETS,
                registry=None,
            )
        )
    return _histogram_holder[0]


def record_api_latency(*, method: str, route: str, seconds: float) -> None:
    """Count one worker API request in the latency histogram (process memory; no query)."""
    _histogram().labels(method=method, route=route).observe(seconds)


def reset_api_latency() -> None:
    """Forget this process's histogram (tests; in multiprocess mode the files stay)."""
    _histogram().clear()


def _histogram_samples():
    """The histogram's samples: of every process writing to PROMETHEUS_MULTIPROC_DIR, else of
    this process."""
    histogram = _histogram()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        families = [f for f in registry.collect() if f.name == HISTOGRAM_NAME]
    else:
        families = list(histogram.collect())
    return [sample for family in families for sample in family.samples]


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
    """The histogram series (summed over processes), sorted by (route, method). No query."""
    bounds = [*(float(b) for b in LATENCY_BUCKETS), float("inf")]
    cumulative: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(bounds))
    sums: dict[tuple[str, str], float] = defaultdict(float)
    for sample in _histogram_samples():
        key = (sample.labels.get("method", ""), sample.labels.get("route", ""))
        if sample.name.endswith("_bucket"):
            cumulative[key][bounds.index(float(sample.labels["le"]))] += sample.value
        elif sample.name.endswith("_sum"):
            sums[key] += sample.value
    series = []
    for method, route in sorted(cumulative, key=lambda k: (k[1], k[0])):
        totals = cumulative[(method, route)]
        per_bucket = [round(totals[0])] + [
            round(totals[i] - totals[i - 1]) for i in range(1, len(totals))
        ]
        if not sum(per_bucket):
            continue
        series.append(
            LatencySeries(
                method=method,
                route=route,
                buckets=tuple(per_bucket),
                sum_seconds=sums[(method, route)],
            )
        )
    return series


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


# --- /metrics through prometheus_client ---------------------------------------------------

_GAUGES = (
    ("outbox_depth", "depth", "Outbox rows waiting for registration (not parked)."),
    ("outbox_due", "due", "Outbox rows due for a drain attempt now."),
    ("outbox_backing_off", "backing_off", "Outbox rows waiting for a retry."),
    ("outbox_parked", "parked", "Outbox rows parked after too many failures."),
    (
        "outbox_oldest_pending_age_seconds",
        "oldest_pending_age_seconds",
        "Age of the oldest outbox row not parked.",
    ),
    ("queued_asset_events", "queued_events", "ADRQ rows waiting for the scheduler."),
)

_COMPONENT_TIMES = (
    ("component_last_run_timestamp_seconds", "last_run_at", "Last run of a component."),
    ("component_last_ok_timestamp_seconds", "last_ok_at", "Last successful run."),
)


class DatabaseCollector(Collector):
    """The gauges and counters every process can answer from the database: queue gauges (two
    queries), the sharded counters (one), component health (one) and the last retention clean
    (one), read once per `collect()`."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        gauges = queue_gauges(now=now)
        for name, attr, help_text in _GAUGES:
            yield GaugeMetricFamily(f"{PREFIX}{name}", help_text, value=getattr(gauges, attr))

        for counter, value in metrics.values().items():
            help_text = f"Total {counter.replace('_', ' ')} since the database was created."
            yield CounterMetricFamily(f"{PREFIX}{counter}", help_text, value=value)

        health = component_health(now=now)
        for name, attr, help_text in _COMPONENT_TIMES:
            family = GaugeMetricFamily(f"{PREFIX}{name}", help_text, labels=["component"])
            for h in health:
                if (at := getattr(h, attr)) is not None:
                    family.add_metric([h.component], at.timestamp())
            yield family
        healthy = GaugeMetricFamily(
            f"{PREFIX}component_healthy",
            "1 when the component succeeded within ASSET_HEALTH_MAX_AGE_SECONDS.",
            labels=["component"],
        )
        for h in health:
            healthy.add_metric([h.component], int(h.healthy))
        yield healthy

        out = events_out_gauges(now=now)
        for name, attr, help_text in _EVENTS_OUT_GAUGES:
            yield GaugeMetricFamily(f"{PREFIX}{name}", help_text, value=getattr(out, attr))

        yield from _watcher_families(watcher_gauges(now=now))

        last = last_retention_clean()
        yield GaugeMetricFamily(
            f"{PREFIX}retention_last_clean_failed",
            "1 when the last retention clean failed (its error is on the dashboard).",
            value=int(not last.ok),
        )
        if last.at is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}retention_last_clean_timestamp_seconds",
                "When the last retention clean ran.",
                value=last.at.timestamp(),
            )


def _watcher_families(gauges: list[WatcherGauge]) -> Iterator[Metric]:
    depth = GaugeMetricFamily(
        f"{PREFIX}watcher_queue_depth",
        "Messages ready in a queue watcher's queue when a consumer last looked (the lag).",
        labels=["watcher"],
    )
    age = GaugeMetricFamily(
        f"{PREFIX}watcher_queue_depth_age_seconds",
        "How long ago a consumer last looked at the watcher's queue (stale: none is running).",
        labels=["watcher"],
    )
    parked = GaugeMetricFamily(
        f"{PREFIX}watcher_parked_messages",
        "Queue messages parked (not parsed or routed) and waiting for an operator.",
        labels=["watcher"],
    )
    for g in gauges:
        parked.add_metric([g.name], g.parked)
        if g.queue_depth is not None and g.depth_age_seconds is not None:
            depth.add_metric([g.name], g.queue_depth)
            age.add_metric([g.name], g.depth_age_seconds)
    yield from (depth, age, parked)


def metrics_registry(*, now: datetime | None = None) -> CollectorRegistry:
    """What `/metrics` shows: the database collector and the latency histogram (every process's
    under PROMETHEUS_MULTIPROC_DIR, else this process's)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(now=now))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_histogram())
    return registry


def render_prometheus(*, now: datetime | None = None) -> str:
    """The `/metrics` body (text exposition format 0.0.4). A fixed number of queries."""
    return generate_latest(metrics_registry(now=now)).decode()


@dataclass(frozen=True)
class FailingDag:
    """A Dag the scheduler skips because it cannot evaluate it (`Dag.schedule_error`)."""

    dag_id: str
    error: str
    since: datetime | None


# /healthz names this many failing Dags (and counts them all).
FAILING_DAGS_SHOWN = 20


@dataclass(frozen=True)
class Health:
    ok: bool
    database: bool
    components: list[ComponentHealth]
    # Not a reason for `ok` to be False (the service and every other Dag work): "degraded".
    failing_dags: list[FailingDag] = field(default_factory=list)
    failing_dag_count: int = 0
    # Nor this: Dags of a bundle no worker claimed for lately (`operations.bundles`).
    unserved_dags: list[UnservedDag] = field(default_factory=list)
    unserved_dag_count: int = 0

    @property
    def status(self) -> str:
        if not self.ok:
            return "unhealthy"
        if self.failing_dag_count:
            return "degraded"
        # In the start-up grace: a drain or scheduler that has not run yet.
        return "starting" if any(c.status == "starting" for c in self.components) else "ok"


def failing_dags(*, limit: int = FAILING_DAGS_SHOWN) -> tuple[list[FailingDag], int]:
    """The first `limit` Dags with a `schedule_error` (by dag_id) and how many there are."""
    failing = Dag.objects.exclude(schedule_error="").order_by("dag_id")
    shown = [
        FailingDag(dag_id, error, since)
        for dag_id, error, since in failing.values_list(
            "dag_id", "schedule_error", "schedule_error_at"
        )[:limit]
    ]
    count = len(shown) if len(shown) < limit else failing.count()
    return shown, count


def health(*, now: datetime | None = None) -> Health:
    """Database reachable, and drain and scheduler succeeded recently; plus the Dags the
    scheduler cannot evaluate (a degraded but working service)."""
    if not database_reachable():
        return Health(ok=False, database=False, components=[])
    components = component_health(now=now)
    shown, count = failing_dags()
    unserved, unserved_count = bundles.unserved_dags(now=now)
    return Health(
        unserved_dags=unserved,
        unserved_dag_count=unserved_count,
        ok=all(c.healthy for c in components),
        database=True,
        components=components,
        failing_dags=shown,
        failing_dag_count=count,
    )
