"""The operator console: lineage graph, runs grid, run page outputs, trigger, audit."""

import json
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from assets_app.admin import base
from assets_app.catalog import run_reads
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AuditEntry,
    Dag,
    DagImportError,
    DagRun,
    DagRunType,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    Task,
    TaskInstance,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TIState,
)
from assets_app.operations import audit
from assets_app.outbox import rows as outbox
from tests.admin import grid_page
from tests.factories import (
    AssetEventFactory,
    AssetEventQueueFactory,
    AssetFactory,
    DagFactory,
    DagRunFactory,
    TaskInstanceFactory,
)

LINEAGE = reverse("admin:assets_app_dag_lineage")


def lineage_data(n_dags: int) -> None:
    """`n_dags` Dags in pipelines of ten, as teams build them: Dag i produces asset i through
    task `t<i>` (every tenth also emits through an alias) and is scheduled on the assets of Dags
    i-1 and i-3 of its pipeline; the third asset of every other pipeline also feeds the next
    pipeline's seventh Dag. Some runs and events, so every node has something to say."""
    dags = Dag.objects.bulk_create(
        [Dag(dag_id=f"dag_{i:03}", schedule=None) for i in range(n_dags)]
    )
    assets = Asset.objects.bulk_create(
        [Asset(name=f"asset_{i:03}", uri=f"s3://lake/asset_{i:03}") for i in range(n_dags)]
    )
    tasks = Task.objects.bulk_create([Task(dag=d, task_id=f"t{i}") for i, d in enumerate(dags)])
    TaskOutletAssetReference.objects.bulk_create(
        [TaskOutletAssetReference(task=t, asset=a) for t, a in zip(tasks, assets, strict=True)]
    )
    alias = AssetAlias.objects.create(name="reports")
    TaskOutletAliasReference.objects.bulk_create(
        [TaskOutletAliasReference(task=t, alias=alias) for t in tasks[::10]]
    )
    AssetAliasAsset.objects.create(alias=alias, asset=assets[0])
    refs = []
    for i, dag in enumerate(dags):
        k = i % 10  # position in its pipeline
        upstream = {j for j in (i - 1, i - 3) if j >= i - k}
        if k == 6 and (i // 10) % 2 == 1:
            upstream.add(i - k - 10 + 2)  # asset 2 of the previous pipeline
        refs += [DagScheduleAssetReference(dag=dag, asset=assets[j]) for j in upstream]
    DagScheduleAssetReference.objects.bulk_create(refs)
    DagScheduleAliasReference.objects.create(dag=dags[-1], alias=alias)
    DagRun.objects.bulk_create(
        [DagRun(dag=d, run_id="manual__1", run_type=DagRunType.MANUAL) for d in dags[::3]]
    )
    AssetEvent.objects.bulk_create([AssetEvent(asset=a) for a in assets[::2]])


@pytest.fixture(autouse=True)
def _fresh_layout_cache():
    cache.clear()


def node_keys(page: str) -> set[str]:
    import re

    return set(re.findall(r'data-key="([^"]+)"', page))


@pytest.mark.parametrize("n_dags", [30, 300])
def test_lineage_draws_every_dag_and_asset_with_a_pinned_query_count(
    staff_client, django_assert_num_queries, n_dags
):
    lineage_data(n_dags)
    # session, user, then: dags, task->asset, task->alias, alias->asset, schedule->asset,
    # schedule->alias, assets, aliases.
    with django_assert_num_queries(10):
        response = staff_client.get(LINEAGE)
    assert response.status_code == 200
    keys = node_keys(response.content.decode())
    assert {k for k in keys if k.startswith("dag:")} == {f"dag:dag_{i:03}" for i in range(n_dags)}
    assert sum(k.startswith("asset:") for k in keys) == n_dags
    assert "alias:" in " ".join(keys)
    # The layout comes from the cache the second time; the page is the same.
    with django_assert_num_queries(10):
        again = staff_client.get(LINEAGE)
    assert node_keys(again.content.decode()) == keys


def test_lineage_neighbourhood_of_an_asset_follows_it_to_its_consumers(staff_client):
    lineage_data(30)
    asset = Asset.objects.get(name="asset_010")
    page = staff_client.get(LINEAGE, {"asset": "asset_010", "depth": 1}).content.decode()
    # producer Dag -> asset -> its two consumers (Dags 11 and 13), nothing else.
    assert node_keys(page) == {f"asset:{asset.pk}", "dag:dag_010", "dag:dag_011", "dag:dag_013"}
    assert reverse("admin:assets_app_dag_change", args=[quote("dag_011")]) in page
    assert 'class="aes-node aes-node-asset aes-node-focus"' in page
    wider = staff_client.get(LINEAGE, {"dag": "dag_011", "depth": 2}).content.decode()
    assert {"dag:dag_010", "dag:dag_012", "dag:dag_014"} <= node_keys(wider)
    assert "dag:dag_020" not in node_keys(wider)
    unknown = staff_client.get(LINEAGE, {"asset": "nope"}).content.decode()
    assert "No asset &#x27;nope&#x27; takes part in any link; showing everything." in unknown


def test_lineage_nodes_show_last_run_last_event_and_waiting(staff_client):
    producer = DagFactory(dag_id="ingest")
    asset = AssetFactory(name="orders")
    task = Task.objects.create(dag=producer, task_id="fetch")
    TaskOutletAssetReference.objects.create(task=task, asset=asset)
    consumer = DagFactory(dag_id="report", is_paused=True)
    DagScheduleAssetReference.objects.create(dag=consumer, asset=asset)
    DagRunFactory(dag=producer, state="failed")
    event = AssetEventFactory(asset=asset)
    consumer.queued_events.create(asset_event=event, asset=asset)
    page = staff_client.get(LINEAGE).content.decode()
    assert "failed now" in page or "failed 0 s ago" in page or "failed " in page
    assert "paused · no runs yet · 1 waiting" in page
    assert "1 waiting" in page and ">fetch</title>" in page


def grid_data(runs: int, tasks: int) -> Dag:
    dag = DagFactory(dag_id="wide")
    Task.objects.bulk_create([Task(dag=dag, task_id=f"task_{t:02}") for t in range(tasks)])
    now = timezone.now()
    created = DagRun.objects.bulk_create(
        [
            DagRun(
                dag=dag,
                run_id=f"manual__{r}",
                run_type=DagRunType.MANUAL,
                state="success",
                start_date=now - timedelta(minutes=r),
                end_date=now,
            )
            for r in range(runs)
        ]
    )
    states = TIState.values
    TaskInstance.objects.bulk_create(
        [
            TaskInstance(
                dag_run=run,
                dag_id=dag.dag_id,
                run_id=run.run_id,
                task_id=f"task_{t:02}",
                state=states[(r + t) % len(states)],
                start_date=now - timedelta(seconds=t + 1),
                end_date=now,
            )
            for r, run in enumerate(created)
            for t in range(tasks)
        ]
    )
    return dag


@pytest.mark.parametrize(("runs", "tasks"), [(3, 4), (25, 50)])
def test_runs_grid_has_a_pinned_query_count(staff_client, django_assert_num_queries, runs, tasks):
    dag = grid_data(runs, tasks)
    url = reverse("admin:assets_app_dag_grid", args=[dag.pk])
    # session, user, the Dag, its runs, its tasks, their upstream links (issue 45's order),
    # their TIs.
    with django_assert_num_queries(7):
        response = staff_client.get(url)
    page = response.content.decode()
    # Issue 45: each task row is one compact string the page's script draws (`grid_page`).
    cells = grid_page.rows(page)
    assert [len(row) for row in cells.values()] == [runs] * tasks
    assert all(cell is not None for row in cells.values() for cell in row)
    colours = {cell["colour"] for row in cells.values() for cell in row}
    assert base.STATE_COLOURS[TIState.UP_FOR_RETRY] in colours
    assert "task_49" in cells or tasks < 50


def test_a_state_without_a_colour_is_drawn_neutral(monkeypatch, staff_client):
    monkeypatch.delitem(base.STATE_COLOURS, TIState.SKIPPED)
    assert base.state_colour(TIState.SKIPPED) == base.NEUTRAL_COLOUR
    assert base.state_colour("some_future_state") == base.NEUTRAL_COLOUR
    assert 'data-state="some_future_state"' in base.state_badge("some_future_state")


def test_run_page_says_which_outputs_never_arrived_and_who_deleted_them(staff_client):
    run = DagRunFactory(dag=DagFactory(dag_id="ingest"), state="success")
    done = TaskInstanceFactory(dag_run=run, task_id="ok", succeeded=True)
    AssetEventFactory(
        asset=AssetFactory(name="orders"),
        source_dag_id="ingest",
        source_run_id=run.run_id,
        source_task_id="ok",
        source_ti_id=done.id,
        source_try_number=1,
    )
    parked_ti = TaskInstanceFactory(dag_run=run, task_id="stuck", succeeded=True)
    parked = AssetEventQueueFactory(
        ti_id=parked_ti.id,
        source_dag_id="ingest",
        source_run_id=run.run_id,
        parked=True,
        park_reason="The task declared asset name='x' uri='y' ...",
        last_error_kind="permanent",
    )
    gone_ti = TaskInstanceFactory(dag_run=run, task_id="gone", succeeded=True)
    gone = AssetEventQueueFactory(
        ti_id=gone_ti.id, source_dag_id="ingest", source_run_id=run.run_id
    )
    outbox.delete_rows(row_ids=[gone.pk], actor=audit.Actor(name="alice", via="admin"))

    listing = staff_client.get(reverse("admin:assets_app_dagrun_changelist")).content.decode()
    assert "1 parked" in listing
    page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "<strong>2</strong> task instances of this run succeeded but their asset events" in text
    assert "is parked: The task declared asset name=&#x27;x&#x27;" in text
    assert "its outbox row was deleted by <strong>alice</strong>" in text
    assert reverse("admin:assets_app_asseteventqueue_change", args=[parked.pk]) in text
    assert "orders #" in text


def test_trigger_with_conf_creates_an_audited_run_and_bad_conf_writes_nothing(staff_client):
    dag = DagFactory(dag_id="ingest")
    url = reverse("admin:assets_app_dag_trigger", args=[dag.pk])
    bad = staff_client.post(url, {"conf": "{nope"})
    assert "conf is not valid JSON" in bad.content.decode()
    not_object = staff_client.post(url, {"conf": "[1]"})
    assert "conf must be a JSON object" in not_object.content.decode()
    assert not DagRun.objects.exists() and not AuditEntry.objects.exists()
    response = staff_client.post(url, {"conf": json.dumps({"day": 3}), "note": "backfill"})
    run = DagRun.objects.get()
    assert response.url == reverse("admin:assets_app_dagrun_change", args=[run.pk])
    assert (run.conf, run.note, run.triggering_user_name) == ({"day": 3}, "backfill", "operator")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_name, entry.via) == ("dag_run.trigger", "operator", "admin")


def test_the_trigger_form_starts_from_the_params_defaults_and_names_a_refusing_param(
    staff_client,
):
    params = {"count": {"default": 5, "schema": {"type": "integer"}}, "day": {}}
    dag = DagFactory(dag_id="ingest", params=json.dumps(params))
    url = reverse("admin:assets_app_dag_trigger", args=[dag.pk])
    form = staff_client.get(url).content.decode()
    assert 'name="param.count" value="5"' in form and 'name="param.day" rows="3"' in form
    refused = staff_client.post(url, {"conf": json.dumps({"count": "5"})})
    assert "Invalid input for param count: &#x27;5&#x27; is not of type" in refused.content.decode()
    assert not DagRun.objects.exists() and not AuditEntry.objects.exists()


def test_correcting_an_asset_uri_is_audited_and_refuses_a_taken_uri(staff_client):
    asset = AssetFactory(name="orders", uri="s3://old/orders")
    AssetFactory(name="other", uri="s3://taken")
    url = reverse("admin:assets_app_asset_change", args=[asset.pk])
    taken = staff_client.post(url, {"uri": "s3://taken"})
    assert taken.status_code == 200 and "already exists" in taken.content.decode()
    staff_client.post(url, {"uri": "s3://lake/orders"})
    asset.refresh_from_db()
    assert asset.uri == "s3://lake/orders" and asset.name == "orders"
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_name, entry.detail) == (
        "asset.change_uri",
        "operator",
        {"old_uri": "s3://old/orders", "new_uri": "s3://lake/orders"},
    )


def test_outbox_row_page_shows_the_reason_the_conflicting_asset_and_the_attempts(staff_client):
    taken = AssetFactory(name="taken", uri="s3://taken")
    row = AssetEventQueueFactory(
        parked=True,
        last_error_kind="permanent",
        park_reason="Correct the stored asset's uri",
        error_detail={"asset_ids": [taken.pk]},
        attempt_history=[
            {
                "at": timezone.now().isoformat(),
                "kind": "permanent",
                "error_type": "assets_app.registration.outlets.RegistrationError",
                "error": "conflict",
            }
        ],
    )
    url = reverse("admin:assets_app_asseteventqueue_change", args=[row.pk])
    page = staff_client.get(url).content.decode()
    assert reverse("admin:assets_app_asset_change", args=[taken.pk]) in page
    assert "Correct the stored asset&#x27;s uri" in page
    assert 'id="attempt-history"' in page and "RegistrationError" in page
    outbox.requeue(row_ids=[row.pk], actor=audit.Actor(name="bob", via="admin"))
    page = staff_client.get(url).content.decode()
    assert "bob" in page and "outbox.requeue" in page
    assert 'id="attempt-history"' in page  # kept as history


def test_clear_requeues_finished_tis_for_a_new_try_and_leaves_running_ones(staff_client):
    dag = DagFactory(dag_id="ingest")
    Task.objects.create(dag=dag, task_id="failed", retries=2)
    run = DagRunFactory(dag=dag, state="failed")
    failed = TaskInstanceFactory(
        dag_run=run,
        task_id="failed",
        state=TIState.FAILED,
        max_tries=2,
        try_number=3,
        hostname="w1",
        end_date=timezone.now(),
    )
    ok = TaskInstanceFactory(dag_run=run, task_id="ok", succeeded=True)
    busy = TaskInstanceFactory(dag_run=run, task_id="busy", running=True)
    url = reverse("admin:assets_app_dagrun_clear", args=[run.pk])

    staff_client.post(url, {"only_failed": "1"})
    failed.refresh_from_db()
    assert (failed.state, failed.try_number, failed.max_tries, failed.hostname) == (
        "queued",
        4,
        5,
        "",
    )
    assert failed.end_date is None
    ok.refresh_from_db()
    assert ok.state == "success"
    run.refresh_from_db()
    assert (run.state, run.clear_number) == ("queued", 1)

    response = staff_client.post(url, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert messages[-2:] == [
        "Cleared 1 task instance(s): ok; they are queued for a new try.",
        "Left alone (queued, running, or held by a worker right now): busy, failed.",
    ]
    busy.refresh_from_db()
    assert busy.state == "running"
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "row_count"))
    assert entries == [("dag_run.clear", 1), ("dag_run.clear", 1)]
    page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    assert 'id="clear-run"' in page.content.decode()


def test_clear_needs_a_post_and_the_permission(db, django_user_model, client):
    run = DagRunFactory()
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    assert client.post(reverse("admin:assets_app_dagrun_clear", args=[run.pk])).status_code == 403


def test_a_dag_scheduled_on_a_hundred_thousand_assets_has_a_small_page(staff_client):
    names = [f"a{i:06}" for i in range(100_000)]
    dag = DagFactory(
        dag_id="huge", schedule={"any": [{"asset": {"name": n, "uri": n}} for n in names]}
    )
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk]))
    assert page.status_code == 200
    assert len(page.content) < 300_000
    assert "every asset it waits on" in page.content.decode()
    listing = staff_client.get(reverse("admin:assets_app_dag_changelist"))
    assert len(listing.content) < 100_000


def test_a_dag_whose_file_did_not_import_links_to_its_import_error(staff_client):
    """Issue 27: the Dag list marks a Dag whose file failed at the last sync; the error's page
    shows the stack trace, read-only."""
    error = DagImportError.objects.create(
        filename="etl/broken.py",
        timestamp=timezone.now(),
        stack_trace="Traceback ...\nModuleNotFoundError: No module named 'pandas_x'",
    )
    # As a worker's sync of Airflow's default bundle writes them (issue 44: errors per bundle).
    DagFactory(dag_id="stale_etl", fileloc="etl/broken.py", bundle_name="dags-folder")
    DagFactory(dag_id="fine_etl", fileloc="etl/fine.py", bundle_name="dags-folder")
    DagFactory(dag_id="other_bundle", fileloc="etl/broken.py", bundle_name="team-b")
    listing = staff_client.get(reverse("admin:assets_app_dag_changelist")).content.decode()
    link = reverse("admin:assets_app_dagimporterror_change", args=[error.pk])
    assert listing.count(link) == 1 and ">import error<" in listing
    page = staff_client.get(link).content.decode()
    assert "No module named &#x27;pandas_x&#x27;" in page and "etl/broken.py" in page
    errors = staff_client.get(reverse("admin:assets_app_dagimporterror_changelist"))
    assert "ModuleNotFoundError" in errors.content.decode()


def test_a_mapped_task_is_one_grid_cell_with_its_summary_state_and_counts(staff_client):
    """Issue 25: a mapped task's map indexes are one cell, coloured by Airflow 3.3.2's grid
    summary (`agg_state`: failed before running before success), its count shown, the counts
    by state in its title, linking to the run's page that lists every map index."""
    run = DagRunFactory(dag=DagFactory(dag_id="fan_out"), state="running")
    states = ["success"] * 5 + ["running"] * 2 + ["failed"]
    for i, state in enumerate(states):
        TaskInstanceFactory(dag_run=run, task_id="each", map_index=i, state=state)
    TaskInstanceFactory(dag_run=run, task_id="plain", state="success")
    page = staff_client.get(reverse("admin:assets_app_dag_grid", args=["fan_out"])).content
    page = page.decode()
    assert [c["state"] for c in grid_page.rows(page)["plain"]] == ["success"]  # unmapped
    assert (
        f'data-state="failed" data-mapped="8" style="background:'
        f'{base.STATE_COLOURS[TIState.FAILED]}">8</span>'
    ) in page
    assert "each (8 mapped) · 1 failed, 2 running, 5 success" in page
    run_page = reverse("admin:assets_app_dagrun_change", args=[run.pk])
    assert f'href="{run_page}#run-task-instances"' in page
    listed = staff_client.get(run_page).content.decode()
    assert all(f"each[{i}]" in listed for i in range(8))


@pytest.mark.parametrize(
    ("states", "shown"),
    [
        (["success", "running", "failed"], "failed"),
        (["success", "upstream_failed", "running"], "upstream_failed"),
        (["success", "queued", "running"], "running"),
        (["success", "scheduled"], "scheduled"),
        (["success", None], None),
        (["skipped", "success"], "success"),
        (["removed", "skipped"], "skipped"),
    ],
)
def test_the_mapped_summary_state_follows_airflows_priority(states, shown):
    assert run_reads.mapped_state(states) == shown


def test_an_unpause_in_the_admin_stores_the_next_run_of_that_instant(staff_client):
    # Issue 40: as the API's unpause, the Dag's stored next run is computed again at the
    # unpause (a paused Dag's is stale: without catchup, the latest tick now).
    from assets_app.definitions import sync as definitions

    start = (timezone.now() - timedelta(days=2)).replace(tzinfo=None).isoformat()
    definitions.sync_definitions(
        dags=definitions.parse_document(
            {"dag_id": "timed", "timetable": "@hourly", "start_date": start, "is_paused": True},
            file="t.json",
        )
    )
    stale = timezone.now() - timedelta(days=1)
    Dag.objects.filter(dag_id="timed").update(next_dagrun=stale, next_dagrun_create_after=stale)
    url = reverse("admin:assets_app_dag_change", args=["timed"])
    before = timezone.now().replace(minute=0, second=0, microsecond=0)
    response = staff_client.post(
        url, {"max_active_runs": "16", "tasks-TOTAL_FORMS": "0", "tasks-INITIAL_FORMS": "0"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    dag = Dag.objects.get(dag_id="timed")
    assert not dag.is_paused
    after = timezone.now().replace(minute=0, second=0, microsecond=0)
    assert dag.next_dagrun_create_after in (before, after)  # the latest hour at the unpause
