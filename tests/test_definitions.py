"""DAG definitions: parsing, validation (each bad case names file and path and writes nothing),
idempotent sync, and the `sync_dags` command, including the issue's acceptance scenario."""

import json
import shutil
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from assets_app.definitions import sync as definitions
from assets_app.definitions.sync import DefinitionError
from assets_app.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AuditEntry,
    Dag,
    DagRun,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    Task,
    TaskInstance,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskUpstream,
)
from assets_app.scheduling import runs
from tests.factories import AssetAliasFactory, AssetFactory, DagFactory, TaskFactory

pytestmark = pytest.mark.django_db

ACCEPTANCE = Path(__file__).parent / "data" / "acceptance_dags.json"
SNAPSHOT_MODELS = (
    Asset,
    AssetAlias,
    Dag,
    Task,
    TaskOutletAssetReference,
    TaskOutletAliasReference,
    DagScheduleAssetReference,
    DagScheduleAliasReference,
    TaskUpstream,
    DagRun,
    TaskInstance,
)


def snapshot() -> dict[str, list[dict]]:
    """Every column of every row the sync may touch, updated_at included."""
    return {
        model.__name__: list(model.objects.order_by("pk").values()) for model in SNAPSHOT_MODELS
    }


def write(path: Path, document) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def sync(*paths) -> definitions.SyncResult:
    return definitions.sync_dags(paths=[str(p) for p in paths])


def schedule_refs(dag_id: str) -> tuple[set[str], set[str]]:
    return (
        set(
            DagScheduleAssetReference.objects.filter(dag_id=dag_id).values_list(
                "asset__name", flat=True
            )
        ),
        set(
            DagScheduleAliasReference.objects.filter(dag_id=dag_id).values_list(
                "alias__name", flat=True
            )
        ),
    )


def outlet_refs(dag_id: str, task_id: str) -> tuple[set[str], set[str]]:
    task = Task.objects.get(dag_id=dag_id, task_id=task_id)
    return (
        set(task.outlet_assets.values_list("name", flat=True)),
        set(task.outlet_aliases.values_list("name", flat=True)),
    )


# --- a good file ---------------------------------------------------------------------------


def test_sync_good_file_creates_everything():
    result = sync(ACCEPTANCE)

    assert result.dag_ids == ("producer", "consumer", "archive")
    assert (result.dags_created, result.dags_updated, result.dags_unchanged) == (3, 0, 0)
    assert (result.tasks_created, result.tasks_updated, result.tasks_deleted) == (5, 0, 0)
    assert (result.assets_created, result.aliases_created) == (3, 1)

    consumer = Dag.objects.get(dag_id="consumer")
    assert consumer.schedule == {
        "all": [
            {"asset": {"name": "a", "uri": "a"}},
            {"any": [{"asset": {"name": "b", "uri": "b"}}, {"alias": "x"}]},
        ]
    }
    assert (consumer.max_active_runs, consumer.is_paused) == (2, False)
    assert consumer.fileloc == str(ACCEPTANCE.resolve())
    producer = Dag.objects.get(dag_id="producer")
    assert producer.schedule is None
    assert producer.description == "produces a and b, and emits through the alias x"
    assert producer.max_active_runs == 16
    assert Dag.objects.get(dag_id="archive").is_paused is True

    assert sorted(Task.objects.values_list("dag_id", "task_id", "retries")) == [
        ("archive", "copy", 0),
        ("consumer", "notify", 0),
        ("consumer", "report", 1),
        ("producer", "extract", 0),
        ("producer", "transform", 2),
    ]
    assert sorted(Asset.objects.values_list("name", "uri")) == [
        ("a", "a"),
        ("b", "b"),
        ("report", "s3://bucket/report"),
    ]
    assert list(AssetAlias.objects.values_list("name", flat=True)) == ["x"]
    assert schedule_refs("consumer") == ({"a", "b"}, {"x"})
    assert schedule_refs("archive") == ({"report"}, set())
    assert schedule_refs("producer") == (set(), set())
    assert outlet_refs("producer", "extract") == ({"a"}, set())
    assert outlet_refs("producer", "transform") == ({"b"}, {"x"})
    assert outlet_refs("consumer", "report") == ({"report"}, set())
    assert outlet_refs("consumer", "notify") == (set(), set())


def test_second_sync_changes_nothing():
    sync(ACCEPTANCE)
    before = snapshot()
    with CaptureQueriesContext(connection) as queries:
        result = sync(ACCEPTANCE)
    assert snapshot() == before
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))
    ]
    assert writes == []
    assert (result.dags_created, result.dags_updated, result.dags_unchanged) == (0, 0, 3)
    assert (result.tasks_created, result.tasks_updated, result.tasks_deleted) == (0, 0, 0)
    assert result.tasks_unchanged == 5
    assert (result.assets_created, result.aliases_created) == (0, 0)
    assert not result.changed


def test_acceptance_sync_then_trigger(tmp_path):
    """The issue's acceptance scenario, through the commands."""
    out = StringIO()
    call_command("sync_dags", str(ACCEPTANCE), stdout=out)
    assert out.getvalue().strip() == (
        "3 dags: 3 created, 0 updated, 0 unchanged; tasks: 5 created, 0 updated, 0 deleted, "
        "0 unchanged; 3 assets and 1 aliases created"
    )

    # archive is paused: its run is taken and waits, queued, for the unpause (as on Airflow).
    for dag_id in ("producer", "consumer", "archive"):
        call_command("trigger_dag", dag_id, stdout=StringIO())

    assert sorted(DagRun.objects.values_list("dag_id", "run_type", "state")) == [
        ("archive", "manual", "queued"),
        ("consumer", "manual", "queued"),
        ("producer", "manual", "queued"),
    ]
    assert sorted(
        TaskInstance.objects.values_list("dag_id", "task_id", "state", "try_number", "max_tries")
    ) == [
        ("archive", "copy", "queued", 1, 0),
        ("consumer", "notify", "queued", 1, 0),
        ("consumer", "report", "queued", 1, 1),
        ("producer", "extract", "queued", 1, 0),
        ("producer", "transform", "queued", 1, 2),
    ]
    for run in DagRun.objects.all():
        assert set(run.task_instances.values_list("run_id", flat=True)) == {run.run_id}

    before = snapshot()
    out = StringIO()
    call_command("sync_dags", str(ACCEPTANCE), stdout=out)
    assert "0 created, 0 updated, 3 unchanged" in out.getvalue()
    assert snapshot() == before


def test_directory_sync_reads_json_files_sorted(tmp_path):
    write(tmp_path / "b.json", {"dag_id": "second"})
    write(tmp_path / "a.json", [{"dag_id": "first"}])
    write(tmp_path / "notes.txt", "not json")
    result = sync(tmp_path)
    assert result.dag_ids == ("first", "second")


def test_changed_file_updates_removes_tasks_and_refs_and_leaves_other_dags_alone(tmp_path):
    sync(ACCEPTANCE)
    unrelated = DagFactory(dag_id="unrelated")
    TaskFactory(dag=unrelated, task_id="keep")
    archive_before = Dag.objects.filter(dag_id="archive").values().get()
    document = json.loads(ACCEPTANCE.read_text())
    producer, consumer, _archive = document
    producer["tasks"] = [{"task_id": "transform", "retries": 5, "outlets": ["c"]}]
    consumer["schedule"] = {"any": ["c", {"alias": "y"}]}
    consumer["is_paused"] = True
    path = write(tmp_path / "acceptance_dags.json", document)

    result = sync(path)

    assert (result.dags_created, result.dags_updated, result.dags_unchanged) == (0, 3, 0)
    assert (result.tasks_created, result.tasks_updated, result.tasks_deleted) == (0, 1, 1)
    assert (result.assets_created, result.aliases_created) == (1, 1)
    assert sorted(Task.objects.filter(dag_id="producer").values_list("task_id", "retries")) == [
        ("transform", 5)
    ]
    assert outlet_refs("producer", "transform") == ({"c"}, set())
    assert schedule_refs("consumer") == ({"c"}, {"y"})
    # is_paused is "paused upon creation" (Airflow): the stored Dag keeps its pause.
    assert Dag.objects.get(dag_id="consumer").is_paused is False
    assert result.pause_kept == (("consumer", False),)
    assert Dag.objects.get(dag_id="consumer").schedule == {
        "any": [{"asset": {"name": "c", "uri": "c"}}, {"alias": "y"}]
    }
    # archive only changed its fileloc (another path); its other columns are untouched.
    archive_after = Dag.objects.filter(dag_id="archive").values().get()
    assert {k: v for k, v in archive_after.items() if k not in ("fileloc", "updated_at")} == {
        k: v for k, v in archive_before.items() if k not in ("fileloc", "updated_at")
    }
    # Dags absent from the files are left alone; assets are never deleted.
    assert list(Task.objects.filter(dag_id="unrelated").values_list("task_id", flat=True)) == [
        "keep"
    ]
    assert set(Asset.objects.values_list("name", flat=True)) == {"a", "b", "c", "report"}


def test_schedule_removed_drops_all_schedule_refs(tmp_path):
    sync(ACCEPTANCE)
    path = write(tmp_path / "c.json", {"dag_id": "consumer", "tasks": []})
    result = sync(path)
    assert result.tasks_deleted == 2
    assert Dag.objects.get(dag_id="consumer").schedule is None
    assert schedule_refs("consumer") == (set(), set())
    assert not Task.objects.filter(dag_id="consumer").exists()


def test_stored_assets_and_aliases_are_reused():
    asset = AssetFactory(name="a", uri="a")
    alias = AssetAliasFactory(name="x")
    result = sync(ACCEPTANCE)
    assert result.assets_created == 2
    assert result.aliases_created == 0
    assert Asset.objects.get(name="a").pk == asset.pk
    assert AssetAlias.objects.get(name="x").pk == alias.pk


def test_sync_query_count_does_not_grow_with_dags(tmp_path, django_assert_max_num_queries):
    """Each step is a fixed number of bulk queries, whatever the number of Dags and tasks."""

    def document(n):
        return [
            {
                "dag_id": f"d{i}",
                "schedule": {"all": [f"in{i}", {"alias": f"al{i}"}]},
                "tasks": [
                    {
                        "task_id": f"t{j}",
                        "outlets": [f"out{i}_{j}"],
                        "upstream": [f"t{k}" for k in range(j)],
                        "trigger_rule": "none_failed",
                    }
                    for j in range(5)
                ],
            }
            for i in range(n)
        ]

    small = write(tmp_path / "small.json", document(1))
    big = write(tmp_path / "big.json", [{**d, "dag_id": f"big{d['dag_id']}"} for d in document(60)])
    with CaptureQueriesContext(connection) as one:
        sync(small)
    with django_assert_max_num_queries(len(one.captured_queries)):
        sync(big)
    assert Task.objects.count() == 5 + 300
    assert TaskUpstream.objects.count() == 61 * 10


# --- bad files: each names file + path, and writes nothing ----------------------------------

GOOD = {"dag_id": "newcomer", "schedule": "fresh", "tasks": [{"task_id": "t", "outlets": ["n"]}]}

BAD_CASES = {
    "invalid_json": (
        '{"dag_id": "d",}',
        "line 1 column 16",
        "invalid JSON: Expecting property name enclosed in double quotes",
    ),
    "nan_is_not_json": ('{"dag_id": "d", "max_active_runs": NaN}', "$", "NaN is not valid JSON"),
    "top_level_not_object": ('"dag"', "$", "must hold a Dag object or a list of them"),
    "list_item_not_object": ('[{"dag_id": "d"}, 3]', "[1]", "a Dag must be an object"),
    "unknown_dag_key": (
        {"dag_id": "d", "scheduel": "a"},
        "scheduel",
        "unknown key 'scheduel' in a Dag (allowed: dag_id, schedule, max_active_runs",
    ),
    "unknown_task_key": (
        [{"dag_id": "d", "tasks": [{"task_id": "t", "retry": 1}]}],
        "[0].tasks[0].retry",
        "unknown key 'retry' in a task",
    ),
    # Issue 39: an Airflow attribute the ledger refuses is refused with the ledger's reason.
    "refused_task_attribute": (
        [{"dag_id": "d", "tasks": [{"task_id": "t", "executor": "LocalExecutor"}]}],
        "[0].tasks[0].executor",
        "attribute 'executor' is refused by the asset service: choosing an executor is not",
    ),
    "refused_dag_attribute": (
        {"dag_id": "d", "access_control": {"Op": ["can_read"]}},
        "access_control",
        "attribute 'access_control' is refused by the asset service: Airflow's per-Dag access",
    ),
    "unknown_asset_ref_key": (
        [{"dag_id": "d", "tasks": [{"task_id": "t", "outlets": [{"name": "a", "url": "b"}]}]}],
        "[0].tasks[0].outlets[0].url",
        "unknown key 'url' in an asset reference (allowed: name, uri)",
    ),
    "outlet_name_wrong_type": (
        [{"dag_id": "d", "tasks": [{"task_id": "t"}, {"task_id": "u", "outlets": [{"name": 5}]}]}],
        "[0].tasks[1].outlets[0].name",
        "must be a string",
    ),
    "missing_dag_id": ({"tasks": []}, "$", "a Dag needs a dag_id"),
    "misspelt_dag_id": (
        [{"dag_id": "d"}, {"dagid": "e"}],
        "[1].dagid",
        "unknown key 'dagid' in a Dag (allowed: dag_id, schedule",
    ),
    "missing_task_id": (
        {"dag_id": "d", "tasks": [{"retries": 1}]},
        "tasks[0]",
        "a task needs a task_id",
    ),
    "dag_id_wrong_type": ({"dag_id": 7}, "dag_id", "must be a string, got an integer"),
    "dag_id_bad_characters": ({"dag_id": "a/b"}, "dag_id", "may contain only letters"),
    "dag_id_trailing_newline": ({"dag_id": "ab\n"}, "dag_id", "may contain only letters"),
    "max_active_runs_string": (
        {"dag_id": "d", "max_active_runs": "3"},
        "max_active_runs",
        "must be an integer, got a string",
    ),
    "max_active_runs_bool": (
        {"dag_id": "d", "max_active_runs": True},
        "max_active_runs",
        "must be an integer, got a boolean",
    ),
    "max_active_runs_zero": (
        {"dag_id": "d", "max_active_runs": 0},
        "max_active_runs",
        "must be at least 1, got 0",
    ),
    "retries_negative": (
        {"dag_id": "d", "tasks": [{"task_id": "t", "retries": -1}]},
        "tasks[0].retries",
        "must be at least 0, got -1",
    ),
    "is_paused_string": ({"dag_id": "d", "is_paused": "no"}, "is_paused", "must be true or false"),
    "tasks_not_list": ({"dag_id": "d", "tasks": {"task_id": "t"}}, "tasks", "must be a list"),
    "outlet_aliases_not_list": (
        {"dag_id": "d", "tasks": [{"task_id": "t", "outlet_aliases": "x"}]},
        "tasks[0].outlet_aliases",
        "must be a list, got a string",
    ),
    "empty_dag_id": ({"dag_id": ""}, "dag_id", "must not be empty"),
    "blank_task_id": (
        {"dag_id": "d", "tasks": [{"task_id": "  "}]},
        "tasks[0].task_id",
        "must not be empty",
    ),
    "empty_outlet": (
        {"dag_id": "d", "tasks": [{"task_id": "t", "outlets": [""]}]},
        "tasks[0].outlets[0]",
        "must not be empty",
    ),
    "empty_outlet_alias": (
        {"dag_id": "d", "tasks": [{"task_id": "t", "outlet_aliases": [""]}]},
        "tasks[0].outlet_aliases[0]",
        "must not be empty",
    ),
    "empty_schedule_asset": (
        {"dag_id": "d", "schedule": {"all": [""]}},
        "schedule.all[0]",
        "empty",
    ),
    "unknown_condition_operator": (
        [{"dag_id": "d", "schedule": {"all": ["a", {"every": ["b"]}]}}],
        "[0].schedule.all[1].every",
        "unknown condition operator 'every'",
    ),
    "empty_any": ({"dag_id": "d", "schedule": {"any": []}}, "schedule.any", "must not be empty"),
    "duplicate_task_id": (
        [{"dag_id": "d", "tasks": [{"task_id": "t"}, {"task_id": "u"}, {"task_id": "t"}]}],
        "[0].tasks[2].task_id",
        "duplicate task_id 't' in dag 'd' (first at [0].tasks[0])",
    ),
    "duplicate_outlet": (
        {"dag_id": "d", "tasks": [{"task_id": "t", "outlets": ["a", {"name": "a"}]}]},
        "tasks[0].outlets[1]",
        "duplicate outlet asset 'a'",
    ),
    "duplicate_dag_id_in_file": (
        [{"dag_id": "d"}, {"dag_id": "d"}],
        "[1].dag_id",
        "duplicate dag_id 'd'",
    ),
    "asset_two_uris": (
        [
            {"dag_id": "d", "schedule": {"name": "a", "uri": "s3://one"}},
            {
                "dag_id": "e",
                "tasks": [{"task_id": "t", "outlets": [{"name": "a", "uri": "s3://2"}]}],
            },
        ],
        "[1].tasks[0].outlets[0]",
        "asset 'a' has uri 's3://2' here but 's3://one' at",
    ),
    "uri_two_names": (
        {
            "dag_id": "d",
            "schedule": {"any": [{"uri": "s3://u"}, {"name": "named", "uri": "s3://u"}]},
        },
        "schedule.any[1]",
        "uri 's3://u' is named 'named' here but 's3://u' at",
    ),
    "asset_conflicts_with_stored": (
        {"dag_id": "d", "schedule": {"name": "stored", "uri": "s3://elsewhere"}},
        "schedule",
        "conflicts with the stored asset 'stored' with uri 's3://bucket/stored'",
    ),
    "alias_cycle_self": (
        [
            {
                "dag_id": "loop",
                "schedule": {"any": ["a", {"alias": "x"}]},
                "tasks": [{"task_id": "t", "outlet_aliases": ["x"]}],
            }
        ],
        "[0].schedule",
        "dag 'loop' would trigger itself: loop.t emits alias 'x'",
    ),
    "asset_self_trigger": (
        {"dag_id": "loop", "schedule": "a", "tasks": [{"task_id": "t", "outlets": ["a"]}]},
        "schedule",
        "dag 'loop' would trigger itself: loop.t produces asset 'a'",
    ),
    "cycle_through_two_dags": (
        [
            {
                "dag_id": "ping",
                "schedule": "b",
                "tasks": [{"task_id": "p", "outlet_aliases": ["x"]}],
            },
            {
                "dag_id": "pong",
                "schedule": {"alias": "x"},
                "tasks": [{"task_id": "q", "outlets": ["b"]}],
            },
        ],
        "[0].schedule",
        "dag 'ping' would trigger itself: ping.p emits alias 'x'; pong.q produces asset 'b'",
    ),
    "cycle_through_stored_alias_link": (
        {
            "dag_id": "loop",
            "schedule": {"alias": "linked"},
            "tasks": [
                {"task_id": "t", "outlets": [{"name": "stored", "uri": "s3://bucket/stored"}]}
            ],
        },
        "schedule",
        "dag 'loop' would trigger itself: loop.t produces asset 'stored'",
    ),
    "unknown_upstream_task": (
        {"dag_id": "d", "tasks": [{"task_id": "a"}, {"task_id": "b", "upstream": ["a", "zz"]}]},
        "tasks[1].upstream[1]",
        "unknown upstream task 'zz' (dag 'd' has no such task)",
    ),
    "task_upstream_of_itself": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "upstream": ["a"]}]},
        "tasks[0].upstream[0]",
        "task 'a' cannot be its own upstream",
    ),
    "duplicate_upstream": (
        {"dag_id": "d", "tasks": [{"task_id": "a"}, {"task_id": "b", "upstream": ["a", "a"]}]},
        "tasks[1].upstream[1]",
        "duplicate upstream task 'a'",
    ),
    "task_cycle": (
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "root"},
                {"task_id": "a", "upstream": ["root", "c"]},
                {"task_id": "b", "upstream": ["a"]},
                {"task_id": "c", "upstream": ["b"]},
            ],
        },
        "tasks[1].upstream",
        "the tasks of dag 'd' form a cycle: a -> b -> c -> a",
    ),
    "unknown_trigger_rule": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "trigger_rule": "all_succes"}]},
        "tasks[0].trigger_rule",
        "unknown trigger rule 'all_succes' (allowed: all_success, all_failed",
    ),
    "negative_retry_delay": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "retry_delay_seconds": -1}]},
        "tasks[0].retry_delay_seconds",
        "must be a finite number of at least 0, got -1",
    ),
    "expand_not_a_list_or_xcom": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": "abc"}}]},
        "tasks[0].expand.x",
        'an expand argument must be a list of values, {"xcom": "<upstream task_id>"}, '
        '{"zip": [{"xcom": ...}, ...]} (optionally with "fillvalue") or {"concat": [{"xcom": '
        "...}, ...]}, got a string",
    ),
    "expand_xcom_unknown_key": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": {"xcom": "b", "key": "k"}}}]},
        "tasks[0].expand.x.key",
        "unknown key 'key' in an expand reference (allowed: xcom)",
    ),
    "expand_two_arguments": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1], "y": [2]}}]},
        "tasks[0].expand",
        "expand over one argument only (the cross product of several is not served yet), got x, y",
    ),
    "expand_empty": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {}}]},
        "tasks[0].expand",
        "expand needs one argument, got none",
    ),
    "expand_argument_not_an_identifier": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"my arg": [1]}}]},
        "tasks[0].expand",
        "argument name 'my arg' must be a Python identifier",
    ),
    "expand_xcom_of_an_unknown_task": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": {"xcom": "nope"}}}]},
        "tasks[0].expand.x.xcom",
        "task 'a' expands over the return value of 'nope', which is not one of its upstream "
        "tasks (dag has no such task): list it in upstream (dag 'd')",
    ),
    "expand_xcom_of_a_task_not_upstream": (
        {
            "dag_id": "d",
            "tasks": [{"task_id": "a"}, {"task_id": "b", "expand": {"x": {"xcom": "a"}}}],
        },
        "tasks[1].expand.x.xcom",
        "task 'b' expands over the return value of 'a', which is not one of its upstream "
        "tasks: list it in upstream (dag 'd')",
    ),
    "expand_xcom_of_a_mapped_group_task": (
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a", "map_group": "g", "expand": {"x": [1, 2]}},
                {"task_id": "b", "upstream": ["a"], "expand": {"x": {"xcom": "a"}}},
            ],
        },
        "tasks[1].expand.x.xcom",
        "task 'b' expands over the return values of 'a', a task of the mapped group 'g': "
        "not served yet",
    ),
    "expand_zip_of_a_task_not_upstream": (
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a"},
                {"task_id": "b"},
                {
                    "task_id": "c",
                    "upstream": ["a"],
                    "expand": {"x": {"zip": [{"xcom": "a"}, {"xcom": "b"}]}},
                },
            ],
        },
        "tasks[2].expand.x.zip[1].xcom",
        "task 'c' expands over the return value of 'b', which is not one of its upstream "
        "tasks: list it in upstream (dag 'd')",
    ),
    "expand_zip_of_nothing": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": {"zip": []}}}]},
        "tasks[0].expand.x.zip",
        "must not be empty",
    ),
    "expand_concat_of_a_literal": (
        # Airflow's own parse fails on it too (a list has no iter_references).
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": {"concat": [[1, 2]]}}}]},
        "tasks[0].expand.x.concat[0]",
        "an expand reference must be an object, got a list",
    ),
    "expand_concat_with_a_fillvalue": (
        {
            "dag_id": "d",
            "tasks": [
                {"task_id": "a", "expand": {"x": {"concat": [{"xcom": "b"}], "fillvalue": 0}}}
            ],
        },
        "tasks[0].expand.x.fillvalue",
        "unknown key 'fillvalue' in a concat (allowed: concat)",
    ),
    "expand_literal_beyond_max_map_length": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": list(range(1025))}}]},
        "tasks[0].expand.x",
        "expand over 1025 values, more than max_map_length 1024 (MAX_MAP_LENGTH) (dag 'd')",
    ),
    "weight_rule_unknown": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "weight_rule": "sideways"}]},
        "tasks[0].weight_rule",
        "sideways",
    ),
    "priority_weight_beyond_32_bits": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "priority_weight": 2**31}]},
        "tasks[0].priority_weight",
        "2147483647",
    ),
    "task_group_lists_an_unknown_task": (
        {"dag_id": "d", "tasks": [{"task_id": "g.a"}], "task_groups": {"g": ["g.a", "g.b"]}},
        "task_groups.g",
        "task group 'g' lists 'g.b', not a task of the Dag",
    ),
    "retry_delay_not_a_number": (
        {"dag_id": "d", "tasks": [{"task_id": "a", "max_retry_delay_seconds": "60"}]},
        "tasks[0].max_retry_delay_seconds",
        "must be a number, got a string",
    ),
}


@pytest.fixture
def stored_state():
    """A database that already holds synced Dags, and an alias linked to an asset."""
    sync(ACCEPTANCE)
    asset = AssetFactory(name="stored", uri="s3://bucket/stored")
    AssetAliasAsset.objects.create(alias=AssetAliasFactory(name="linked"), asset=asset)
    return snapshot()


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_file_names_file_and_path_and_writes_nothing(tmp_path, stored_state, case):
    document, path, message = BAD_CASES[case]
    # A valid file sorted before the bad one: it must not be written either.
    write(tmp_path / "00_good.json", GOOD)
    bad = write(tmp_path / "10_bad.json", document)

    with pytest.raises(DefinitionError) as info:
        sync(tmp_path)

    error = info.value
    assert (error.file, error.path) == (str(bad), path)
    assert message in error.message
    assert str(error) == f"{bad}: {path}: {error.message}"
    assert snapshot() == stored_state


def test_a_schema_problem_names_the_file_the_path_and_the_dag(tmp_path):
    bad = write(
        tmp_path / "d.json",
        [{"dag_id": "ok"}, {"dag_id": "report", "tasks": [{"task_id": "t", "retries": -1}]}],
    )
    with pytest.raises(DefinitionError) as info:
        sync(bad)
    assert str(info.value) == (
        f"{bad}: [1].tasks[0].retries: must be at least 0, got -1 (dag 'report')"
    )
    # The checks after the schema name it too.
    write(bad, {"dag_id": "report", "tasks": [{"task_id": "t", "outlet_aliases": ["x", "x"]}]})
    with pytest.raises(DefinitionError) as info:
        sync(bad)
    assert str(info.value) == (
        f"{bad}: tasks[0].outlet_aliases[1]: duplicate outlet alias 'x' (dag 'report')"
    )


def test_duplicate_dag_id_across_files_names_both(tmp_path):
    first = write(tmp_path / "a.json", [{"dag_id": "one"}, {"dag_id": "dup"}])
    second = write(tmp_path / "b.json", {"dag_id": "dup"})
    with pytest.raises(DefinitionError) as info:
        sync(tmp_path)
    assert (
        str(info.value) == f"{second}: dag_id: duplicate dag_id 'dup' (also at {first}: [1].dag_id)"
    )
    assert not Dag.objects.exists()


def test_a_dag_fed_by_another_is_not_a_cycle(tmp_path):
    path = write(
        tmp_path / "chain.json",
        [
            {
                "dag_id": "up",
                "tasks": [{"task_id": "t", "outlets": ["a"], "outlet_aliases": ["x"]}],
            },
            {
                "dag_id": "mid",
                "schedule": {"any": ["a", {"alias": "x"}]},
                "tasks": [{"task_id": "t", "outlets": ["b"]}],
            },
            {"dag_id": "down", "schedule": "b", "tasks": [{"task_id": "t", "outlets": ["a2"]}]},
        ],
    )
    assert sync(path).dags_created == 3


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(DefinitionError, match="no such file or directory"):
        sync(tmp_path / "nope.json")
    with pytest.raises(DefinitionError, match=r"directory holds no \*\.json files"):
        sync(tmp_path)


def test_sync_dags_command_error_exits_nonzero_and_writes_nothing(tmp_path):
    bad = write(tmp_path / "bad.json", [{"dag_id": "d", "tasks": [{"task_id": "t", "x": 1}]}])
    out = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("sync_dags", str(ACCEPTANCE), str(bad), stdout=out)
    assert str(info.value).startswith(f"{bad}: [0].tasks[0].x: unknown key 'x' in a task")
    assert str(info.value).endswith("nothing was written")
    assert not Dag.objects.exists()
    assert not Asset.objects.exists()


def test_parsed_definitions_are_frozen_dataclasses():
    (dag,) = definitions.parse_text(
        '{"dag_id": "d", "tasks": [{"task_id": "t", "outlets": ["a"]}]}', file="f.json"
    )
    assert dag.tasks[0].outlets[0].uri == "a"
    with pytest.raises(AttributeError):
        dag.dag_id = "other"  # type: ignore[misc]


def test_trigger_after_sync_uses_synced_tasks(tmp_path):
    sync(ACCEPTANCE)
    run = runs.trigger_dag(dag_id="consumer")
    assert sorted(run.task_instances.values_list("task_id", "max_tries")) == [
        ("notify", 0),
        ("report", 1),
    ]


def test_example_dags_directory_syncs_if_present():
    """The demo's definitions (another room) must at least be valid."""
    examples = Path(__file__).resolve().parent.parent / "examples" / "dags"
    if not examples.is_dir() or not any(examples.glob("*.json")):
        pytest.skip("no examples/dags yet")
    result = sync(examples)
    assert result.dags_created == len(result.dag_ids) > 0


def test_copying_a_file_elsewhere_only_updates_fileloc(tmp_path):
    sync(ACCEPTANCE)
    copy = tmp_path / "copy.json"
    shutil.copy(ACCEPTANCE, copy)
    result = sync(copy)
    assert result.dags_updated == 3
    assert set(Dag.objects.values_list("fileloc", flat=True)) == {str(copy.resolve())}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_assets", [True, False])
def test_concurrent_syncs_of_the_same_new_files_both_succeed(tmp_path, with_assets):
    """Several hosts may run sync_dags at start-up at once: they serialize, none fails."""
    if with_assets:
        path, dags, tasks = ACCEPTANCE, 3, 5
    else:
        document = [{"dag_id": f"d{i}", "tasks": [{"task_id": "t"}]} for i in range(3)]
        path, dags, tasks = write(tmp_path / "plain.json", document), 3, 3
    n = 4
    barrier = threading.Barrier(n)
    results: list[definitions.SyncResult] = []
    errors: list[BaseException] = []

    def run():
        try:
            barrier.wait()
            results.append(sync(path))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(r.dags_created for r in results) == [0] * (n - 1) + [dags]
    assert sorted(r.dags_unchanged for r in results) == [0] + [dags] * (n - 1)
    assert Dag.objects.count() == dags
    assert Task.objects.count() == tasks


def test_a_new_dag_is_paused_at_creation_unless_its_definition_says_otherwise(tmp_path, settings):
    # Issue 39, Airflow's dags_are_paused_at_creation (True by default) when the definition
    # says nothing (is_paused_upon_creation=None in a DAG file).
    sync(write(tmp_path / "a.json", {"dag_id": "silent"}))
    sync(write(tmp_path / "b.json", {"dag_id": "runs", "is_paused": False}))
    assert Dag.objects.get(dag_id="silent").is_paused is True
    assert Dag.objects.get(dag_id="runs").is_paused is False
    settings.DAGS_ARE_PAUSED_AT_CREATION = False
    sync(write(tmp_path / "c.json", {"dag_id": "unpaused"}))
    sync(write(tmp_path / "d.json", {"dag_id": "held", "is_paused": True}))
    assert Dag.objects.get(dag_id="unpaused").is_paused is False
    assert Dag.objects.get(dag_id="held").is_paused is True


def test_a_definition_silent_on_pause_never_changes_a_stored_dags_pause(tmp_path, settings):
    settings.DAGS_ARE_PAUSED_AT_CREATION = False
    path = write(tmp_path / "d.json", {"dag_id": "d"})
    sync(path)
    Dag.objects.filter(dag_id="d").update(is_paused=True)  # the operator pauses it
    result = sync(path)
    assert Dag.objects.get(dag_id="d").is_paused is True
    assert (result.pause_kept, result.dags_unchanged) == ((), 1)
    call_command("sync_dags", str(path), "--apply-pause", stdout=StringIO())
    assert Dag.objects.get(dag_id="d").is_paused is True  # the file says nothing to apply


def test_sync_keeps_an_operators_pause_unless_told_to_apply_the_definition(tmp_path):
    path = write(tmp_path / "d.json", {"dag_id": "d", "is_paused": True})
    sync(path)
    assert Dag.objects.get(dag_id="d").is_paused is True  # applied on creation
    Dag.objects.filter(dag_id="d").update(is_paused=False)  # the operator unpauses it
    result = sync(path)
    assert Dag.objects.get(dag_id="d").is_paused is False
    assert result.pause_kept == (("d", False),)
    assert "kept dag d unpaused as an operator set it" in result.summary()
    out = StringIO()
    call_command("sync_dags", str(path), "--apply-pause", stdout=out)
    assert Dag.objects.get(dag_id="d").is_paused is True
    assert "kept dag" not in out.getvalue()


def test_sync_says_which_queued_events_a_schedule_change_strands_and_clears_them(tmp_path):
    path = write(tmp_path / "d.json", [{"dag_id": "d", "schedule": {"any": ["a", "b"]}}])
    sync(path)
    a, b = Asset.objects.get(name="a"), Asset.objects.get(name="b")
    dag = Dag.objects.get(dag_id="d")
    for asset in (a, a, b):
        dag.queued_events.create(asset_event=AssetEvent.objects.create(asset=asset), asset=asset)
    write(tmp_path / "d.json", [{"dag_id": "d", "schedule": "b"}])
    result = sync(path)
    assert result.unscheduled_waiting == (("d", 2),)
    assert "dag d: 2 queued events wait on assets no longer in its schedule" in result.summary()
    out = StringIO()
    call_command("sync_dags", str(path), "--clear-unscheduled", stdout=out)
    assert "dag d: cleared 2 unscheduled queued events" in out.getvalue()
    assert list(dag.queued_events.values_list("asset_id", flat=True)) == [b.pk]
    entry = AuditEntry.objects.get(action="queued_events.clear")
    assert (entry.action, entry.via, entry.row_count) == ("queued_events.clear", "command", 2)
    # The syncs that changed the Dag are audited too (issue 26).
    assert AuditEntry.objects.filter(action="sync_dags").count() == 2


def test_effective_priority_weights_are_totalled_as_airflows_strategies(tmp_path):
    """downstream: own + every task downstream once (a diamond's join counted once); upstream:
    own + every task upstream; absolute: own. A second sync after a weight change rewrites
    the totals that depend on it, and only those."""
    document = {
        "dag_id": "w",
        "tasks": [
            {"task_id": "a", "priority_weight": 2},
            {"task_id": "b", "upstream": ["a"], "priority_weight": 3, "weight_rule": "upstream"},
            {"task_id": "c", "upstream": ["a"], "priority_weight": 5, "weight_rule": "absolute"},
            {"task_id": "e", "upstream": ["b", "c"], "priority_weight": 7},
            {"task_id": "lone"},
        ],
    }
    sync(write(tmp_path / "w.json", document))

    def totals() -> dict[str, int]:
        return dict(Task.objects.filter(dag_id="w").values_list("task_id", "priority_weight_total"))

    assert totals() == {"a": 17, "b": 5, "c": 5, "e": 7, "lone": 1}
    document["tasks"][3]["priority_weight"] = 10
    sync(write(tmp_path / "w.json", document))
    assert totals() == {"a": 20, "b": 5, "c": 5, "e": 10, "lone": 1}


def test_task_groups_are_stored_sorted_and_a_second_sync_changes_nothing(tmp_path):
    """Airflow's task groups (issue 39): each group's tasks as the worker's reads by
    `task_group_id` find them (`runtime.requests`)."""
    document = {
        "dag_id": "grouped",
        "tasks": [{"task_id": "g.b"}, {"task_id": "g.a"}, {"task_id": "lone"}],
        "task_groups": {"g": ["g.b", "g.a"], "g.empty": []},
    }
    sync(write(tmp_path / "g.json", document))
    assert Dag.objects.get(dag_id="grouped").task_groups == {"g": ["g.a", "g.b"], "g.empty": []}
    assert sync(tmp_path).dags_updated == 0
    del document["task_groups"]
    sync(write(tmp_path / "g.json", document))
    assert Dag.objects.get(dag_id="grouped").task_groups == {}
