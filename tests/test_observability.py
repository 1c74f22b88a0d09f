"""/metrics (Prometheus text format: gauges and counters from the database, the worker API
latency histogram from process memory) and /healthz."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from assets_app.models import AssetDagRunQueue, ComponentHeartbeat, MetricCounter
from assets_app.operations import metrics, observability
from tests.factories import AssetEventFactory, AssetEventQueueFactory, DagFactory


def scrape(client=None) -> tuple[dict[str, Metric], dict[str, float]]:
    """/metrics parsed by prometheus_client's own parser: the families, and every
    sample as `name{label="value",...}` (labels sorted) -> value."""
    response = (client or Client()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    parsed = list(text_string_to_metric_families(response.content.decode()))
    # By the name of their TYPE line: the parser drops a counter's `_total`, and the gauge
    # `outbox_parked` and the counter `outbox_parked_total` would collide.
    families = {f.name + ("_total" if f.type == "counter" else ""): f for f in parsed}
    assert len(families) == len(parsed)
    samples = {}
    for family in parsed:
        assert family.name.startswith("asset_service_"), family.name
        assert family.documentation, family.name
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return families, samples


@pytest.fixture(autouse=True)
def empty_latency_histogram():
    observability.reset_api_latency()
    yield
    observability.reset_api_latency()


@pytest.fixture(autouse=True)
def started_long_ago(monkeypatch):
    """This process started long ago (out of the start-up grace) unless a test says otherwise."""
    monkeypatch.setattr(observability, "_PROCESS_STARTED_AT", timezone.now() - timedelta(hours=1))


def beat(component, *, ago, ok=True):
    at = timezone.now() - ago
    ComponentHeartbeat.objects.update_or_create(
        component=component, defaults={"last_run_at": at, "last_ok_at": at if ok else None}
    )


@pytest.mark.django_db
def test_metrics_gauges_and_counters():
    now = timezone.now()
    AssetEventQueueFactory(created_at=now - timedelta(seconds=90), next_attempt_at=now)
    AssetEventQueueFactory(attempts=3, next_attempt_at=now + timedelta(minutes=5))
    AssetEventQueueFactory(parked=True, created_at=now - timedelta(hours=5))
    dag = DagFactory()
    event = AssetEventFactory()
    AssetDagRunQueue.objects.create(target_dag=dag, asset_event=event, asset=event.asset)
    MetricCounter.objects.create(name=metrics.REGISTERED, shard=0, value=40)
    MetricCounter.objects.create(name=metrics.REGISTERED, shard=3, value=2)

    families, samples = scrape()
    assert samples["asset_service_outbox_depth"] == 2
    assert samples["asset_service_outbox_due"] == 1
    assert samples["asset_service_outbox_backing_off"] == 1
    assert samples["asset_service_outbox_parked"] == 1
    # The parked row is older but does not count: it waits for an operator, not a drain.
    assert 90 <= samples["asset_service_outbox_oldest_pending_age_seconds"] < 120
    assert samples["asset_service_queued_asset_events"] == 1
    assert samples["asset_service_outbox_registered_total"] == 42
    for counter in metrics.COUNTERS:
        assert families[f"asset_service_{counter}_total"].type == "counter"
        assert f"asset_service_{counter}_total" in samples
    assert families["asset_service_outbox_depth"].type == "gauge"
    assert samples['asset_service_component_healthy{component="drain"}'] == 0


@pytest.mark.django_db
def test_metrics_query_count_is_fixed(django_assert_num_queries):
    AssetEventQueueFactory()
    # Queue gauges (2), counters, component health, the last retention clean (issue 30),
    # freshness policies and webhook messages by state (issue 29, 2), queue watchers (issue 28).
    with django_assert_num_queries(8):
        scrape()
    for _ in range(20):
        AssetEventQueueFactory(parked=True)
    with django_assert_num_queries(8):
        scrape()


@pytest.mark.django_db(transaction=True)
def test_worker_api_latency_histogram_counts_each_request():
    client = Client()
    client.get("/execution/assets/by-name", {"name": "x"})  # 401: still a worker API request
    client.get("/execution/assets/by-name", {"name": "y"})
    client.get("/admin/login/")  # not the worker API: not counted
    _, samples = scrape(client)
    route = "execution/assets/by-name"
    labels = f'method="GET",route="{route}"'
    assert samples[f"asset_service_worker_api_request_duration_seconds_count{{{labels}}}"] == 2
    assert (
        samples[f'asset_service_worker_api_request_duration_seconds_bucket{{le="+Inf",{labels}}}']
        == 2
    )
    buckets = [
        samples[f'asset_service_worker_api_request_duration_seconds_bucket{{le="{le}",{labels}}}']
        for le in (
            "0.005",
            "0.01",
            "0.025",
            "0.05",
            "0.1",
            "0.25",
            "0.5",
            "1.0",
            "2.5",
            "5.0",
            "10.0",
        )
    ]
    assert buckets == sorted(buckets)  # cumulative
    assert 0 < samples[f"asset_service_worker_api_request_duration_seconds_sum{{{labels}}}"] < 10
    series = observability.latency_histograms()
    assert [(s.method, s.route, s.count) for s in series] == [("GET", route, 2)]


@pytest.mark.django_db
def test_latency_histogram_places_buckets_without_a_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        observability.record_api_latency(method="PATCH", route="r", seconds=0.003)
        observability.record_api_latency(method="PATCH", route="r", seconds=0.2)
        observability.record_api_latency(method="PATCH", route="r", seconds=30.0)
        (series,) = observability.latency_histograms()
    assert series.buckets == (1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1)
    assert series.sum_seconds == pytest.approx(30.203)


@pytest.mark.django_db
def test_latency_histogram_sums_the_processes_of_a_multiprocess_directory(tmp_path, monkeypatch):
    """Under gunicorn every worker records into PROMETHEUS_MULTIPROC_DIR; whichever worker
    answers /metrics reports the sum. Two real processes record, this one reads."""
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PYTHONPATH": str(root),
    }
    record = (
        "import sys, django; django.setup(); from assets_app.operations import observability as o; "
        "o.record_api_latency(method='PATCH', route='r', seconds=float(sys.argv[1]))"
    )
    for seconds in ("0.003", "0.2"):
        subprocess.run([sys.executable, "-c", record, seconds], env=env, cwd=root, check=True)
    assert len(list(tmp_path.glob("*.db"))) == 2  # one file per process
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (series,) = observability.latency_histograms()
    assert (series.method, series.route) == ("PATCH", "r")
    assert series.buckets == (1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
    assert series.sum_seconds == pytest.approx(0.203)
    # /metrics renders the directory's histogram too, next to the database collector.
    _, samples = scrape()
    labels = 'method="PATCH",route="r"'
    prefix = "asset_service_worker_api_request_duration_seconds"
    assert samples[f"{prefix}_count{{{labels}}}"] == 2
    assert samples[f'{prefix}_bucket{{le="0.005",{labels}}}'] == 1
    assert samples[f'{prefix}_bucket{{le="0.25",{labels}}}'] == 2
    assert "asset_service_outbox_depth" in samples


@pytest.mark.django_db
def test_metrics_component_health_by_label():
    """One sample per component: its last run and last success as Unix seconds, and healthy."""
    beat("drain", ago=timedelta(seconds=10))
    beat("scheduler", ago=timedelta(hours=2), ok=False)
    drain_at = ComponentHeartbeat.objects.get(component="drain").last_run_at.timestamp()
    families, samples = scrape()
    runs = "asset_service_component_last_run_timestamp_seconds"
    oks = "asset_service_component_last_ok_timestamp_seconds"
    assert samples[f'{runs}{{component="drain"}}'] == pytest.approx(drain_at, abs=0.001)
    assert samples[f'{oks}{{component="drain"}}'] == pytest.approx(drain_at, abs=0.001)
    assert f'{runs}{{component="scheduler"}}' in samples
    assert f'{oks}{{component="scheduler"}}' not in samples  # never succeeded: no sample
    assert samples['asset_service_component_healthy{component="drain"}'] == 1
    assert samples['asset_service_component_healthy{component="scheduler"}'] == 0
    assert families["asset_service_component_healthy"].documentation == (
        "1 when the component succeeded within ASSET_HEALTH_MAX_AGE_SECONDS."
    )


@pytest.mark.django_db
def test_metrics_label_values_round_trip_whatever_their_characters():
    """A route label with a quote, a backslash and a newline reads back unchanged: the
    exposition escapes it (prometheus_client's, not ours)."""
    route = 'execution/a"b\\c\nd'
    observability.record_api_latency(method="GET", route=route, seconds=0.01)
    families, _ = scrape()
    family = families["asset_service_worker_api_request_duration_seconds"]
    assert family.type == "histogram"
    counts = [s for s in family.samples if s.name.endswith("_count")]
    assert [(s.labels, s.value) for s in counts] == [({"method": "GET", "route": route}, 1)]


@pytest.mark.django_db
def test_healthz_ok_when_drain_scheduler_and_repair_succeeded_recently():
    beat("drain", ago=timedelta(seconds=10))
    beat("scheduler", ago=timedelta(seconds=70))
    beat("repair", ago=timedelta(seconds=30))
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["database"] == "ok"
    assert {name: c["status"] for name, c in body["components"].items()} == {
        "drain": "ok",
        "scheduler": "ok",
        "repair": "ok",
    }


@pytest.mark.django_db
def test_healthz_503_when_the_timers_process_stopped_beating():
    """Issue 41: the timers' repair beats every TASK_REPAIR_INTERVAL_SECONDS; a stopped timers
    process (late webhooks, ticks not run) shows here."""
    beat("drain", ago=timedelta(seconds=10))
    beat("scheduler", ago=timedelta(seconds=10))
    beat("repair", ago=timedelta(minutes=10))
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["components"]["repair"]["status"] == "stale"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setup", "drain_status"),
    [
        (lambda: None, "never seen"),
        (lambda: beat("drain", ago=timedelta(minutes=10)), "stale"),
        (lambda: beat("drain", ago=timedelta(seconds=5), ok=False), "failing"),
    ],
    ids=["missing", "stale", "failing"],
)
def test_healthz_503_when_a_component_is_not_healthy(setup, drain_status):
    beat("scheduler", ago=timedelta(seconds=5))
    beat("repair", ago=timedelta(seconds=5))
    setup()
    response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert body["components"]["drain"]["status"] == drain_status
    assert body["components"]["scheduler"]["status"] == "ok"


@pytest.mark.django_db
def test_healthz_503_when_the_database_is_unreachable(monkeypatch):
    monkeypatch.setattr(observability, "database_reachable", lambda: False)
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["database"] == "unreachable"


@pytest.mark.django_db
def test_healthz_threshold_comes_from_settings(settings):
    for component in ("drain", "scheduler", "repair"):
        beat(component, ago=timedelta(seconds=100))
    settings.ASSET_HEALTH_MAX_AGE_SECONDS = 60
    assert Client().get("/healthz").status_code == 503
    settings.ASSET_HEALTH_MAX_AGE_SECONDS = 180
    assert Client().get("/healthz").status_code == 200


def test_latency_quantile_is_the_bucket_bound():
    assert observability.latency_quantile([], 0.5) is None
    for seconds in (0.003, 0.004, 0.02, 0.2):
        observability.record_api_latency(method="GET", route="a", seconds=seconds)
    observability.record_api_latency(method="PUT", route="b", seconds=12.0)
    series = observability.latency_histograms()
    assert observability.latency_quantile(series, 0.4) == 0.005
    assert observability.latency_quantile(series, 0.6) == 0.025
    assert observability.latency_quantile(series, 0.8) == 0.25
    assert observability.latency_quantile(series, 0.99) == float("inf")


@pytest.mark.django_db
def test_healthz_fresh_start_is_starting_not_503(monkeypatch, settings):
    """Finding 8: a service started 5 s ago whose cluster has not run a sweep yet (the drain never
    seen, the scheduler last seen in a previous life, an hour ago) answers 200 "starting"; once
    the grace has passed the same state is 503, and a run since the start that failed is 503 at
    once."""
    settings.ASSET_HEALTH_STARTUP_GRACE_SECONDS = 90
    monkeypatch.setattr(observability, "_PROCESS_STARTED_AT", timezone.now() - timedelta(seconds=5))
    beat("scheduler", ago=timedelta(hours=1))
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "starting"
    assert {n: c["status"] for n, c in body["components"].items()} == {
        "drain": "starting",
        "scheduler": "starting",
        "repair": "starting",
    }

    beat("drain", ago=timedelta(seconds=1), ok=False)
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["components"]["drain"]["status"] == "failing"

    ComponentHeartbeat.objects.filter(component="drain").delete()
    monkeypatch.setattr(
        observability, "_PROCESS_STARTED_AT", timezone.now() - timedelta(seconds=91)
    )
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["components"]["drain"]["status"] == "never seen"
    assert response.json()["components"]["scheduler"]["status"] == "stale"


@pytest.mark.django_db
def test_healthz_grace_zero_is_the_old_rule(monkeypatch, settings):
    settings.ASSET_HEALTH_STARTUP_GRACE_SECONDS = 0
    monkeypatch.setattr(observability, "_PROCESS_STARTED_AT", timezone.now())
    assert Client().get("/healthz").status_code == 503


@pytest.mark.django_db
def test_queue_watcher_gauges_on_metrics():
    """Issue 28: per watcher, the lag (queue depth a consumer saw), its age and the parked."""
    from assets_app.watchers import messages as watchers
    from tests.factories import QueueWatcherFactory

    watcher = QueueWatcherFactory(name="sales")
    QueueWatcherFactory(name="idle")
    watchers.record_queue_depth(watcher_id=watcher.pk, depth=17)
    table = watchers.route_table(watcher_id=watcher.pk)
    watchers.handle_message(table=table, delivery=watchers.Delivery(routing_key="k", body=b"x"))
    _, samples = scrape()
    assert samples['asset_service_watcher_queue_depth{watcher="sales"}'] == 17
    assert samples['asset_service_watcher_parked_messages{watcher="sales"}'] == 1
    assert samples['asset_service_watcher_parked_messages{watcher="idle"}'] == 0
    assert 'asset_service_watcher_queue_depth{watcher="idle"}' not in samples
    assert "asset_service_watcher_messages_registered_total" in samples
