"""Airflow DAG files -> definitions (`airflow_worker.dag_files`, run in the Task SDK's own
virtualenv) and their sync through `POST /execution/dags/sync` with sync_dags' validation."""

import json
import subprocess
import textwrap

import pytest
from django.utils import timezone

from assets_app.definitions import sync as definitions
from assets_app.models import AssetEvent, Dag, DagImportError, QueueWatcher, Task
from tests import rabbitmq
from tests.compat.airflow_worker_env import ROOT, convert_folder, sdk_python
from tests.proof.conftest import app_table_counts
from tests.test_watchers import consume


def _convert(folder, *, manual_only=False) -> dict:
    """{file: its definitions, ..., "import_errors": {file: error}} of an Airflow DAG folder."""
    return convert_folder(folder, manual_only=manual_only)


# Slow: the conversions run in the Task SDK's virtualenv (one fork server per test process); the
# first use of that virtualenv builds it (.ci/run builds it beforehand).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def examples():
    converted = _convert(ROOT / "examples/airflow_dags")
    assert converted.pop("import_errors") == {}
    return converted


def _dag(examples, file, dag_id):
    return next(d for d in examples[file] if d["dag_id"] == dag_id)


def test_asset_schedule_with_and_or_alias(examples):
    consumer = _dag(examples, "consumer.py", "af_consumer")
    assert consumer["schedule"] == {
        "any": [
            {
                "all": [
                    {"name": "af_orders", "uri": "file:///tmp/airflow-demo/orders.csv"},
                    {"alias": "af_cleaned"},
                ]
            },
            {"name": "af_orders_manual", "uri": "file:///tmp/airflow-demo/orders_manual.csv"},
        ]
    }


def test_tasks_outlets_upstream_trigger_rules_retries(examples):
    (produce,) = _dag(examples, "producer.py", "af_producer")["tasks"]
    assert produce["outlets"] == [
        {"name": "af_orders", "uri": "file:///tmp/airflow-demo/orders.csv"}
    ]
    assert produce["outlet_aliases"] == ["af_cleaned"]
    tasks = {t["task_id"]: t for t in _dag(examples, "branch.py", "af_branch")["tasks"]}
    assert tasks["join"]["upstream"] == ["left", "right"]
    assert tasks["join"]["trigger_rule"] == "none_failed_min_one_success"
    assert "upstream" not in tasks["choose"] and "trigger_rule" not in tasks["left"]
    (flaky,) = _dag(examples, "retry.py", "af_retry")["tasks"]
    assert (flaky["retries"], flaky["retry_delay_seconds"]) == (2, 2.0)


TIME_DAGS = """
import datetime
from airflow.sdk import dag, task
from airflow.timetables.events import EventsTimetable
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow.timetables.trigger import (
    CronTriggerTimetable, DeltaTriggerTimetable, MultipleCronTriggerTimetable,
)
import pendulum

START = pendulum.datetime(2026, 1, 1, tz="Europe/Zurich")


def make(dag_id, schedule, **kw):
    @dag(dag_id=dag_id, schedule=schedule, start_date=START, **kw)
    def d():
        task(task_id="t")(lambda: None)()

    d()


make("t_daily", "@daily")
make("t_cron", "0 3 * * *", catchup=True)
make("t_delta", datetime.timedelta(hours=6))
make("t_once", "@once")
make("t_zurich", CronTriggerTimetable("0 3 * * *", timezone="Europe/Zurich",
     interval=datetime.timedelta(hours=1), run_immediately=True))
make("t_data", CronDataIntervalTimetable("30 2 * * *", timezone="America/New_York"))
make("t_deltat", DeltaTriggerTimetable(datetime.timedelta(minutes=90)))
make("t_multi", MultipleCronTriggerTimetable("0 3 * * *", "0 15 * * 1-5", timezone="UTC"))
make("t_events", EventsTimetable([pendulum.datetime(2026, 3, 29, 2, 30, tz="Europe/Zurich")]))
"""


def test_time_schedules_become_timetables_the_service_accepts(tmp_path):
    from assets_app.definitions import sync as definitions

    (tmp_path / "timed.py").write_text(TIME_DAGS)
    converted = {d["dag_id"]: d for d in _convert(tmp_path)["timed.py"]}
    # Airflow 3: a cron string or preset is a CronTriggerTimetable, a timedelta a DeltaTrigger.
    assert converted["t_daily"]["timetable"] == {
        "kind": "cron_trigger",
        "cron": "0 0 * * *",  # Airflow spells the preset out
        "timezone": "Europe/Zurich",
        "interval": 0.0,
        "run_immediately": False,
    }
    assert converted["t_daily"]["timezone"] == "Europe/Zurich"
    assert converted["t_daily"]["start_date"] == "2025-12-31T23:00:00+00:00"
    assert converted["t_daily"]["catchup"] is False
    assert converted["t_cron"]["catchup"] is True
    assert converted["t_delta"]["timetable"] == {
        "kind": "delta_trigger",
        "delta": 21600.0,
        "interval": 0.0,
    }
    assert converted["t_once"]["timetable"] == "@once"
    zurich = converted["t_zurich"]["timetable"]
    assert (zurich["timezone"], zurich["interval"], zurich["run_immediately"]) == (
        "Europe/Zurich",
        3600.0,
        True,
    )
    assert converted["t_data"]["timetable"]["kind"] == "cron_data_interval"
    assert converted["t_multi"]["timetable"]["crons"] == ["0 3 * * *", "0 15 * * 1-5"]
    assert converted["t_events"]["timetable"]["event_dates"] == ["2026-03-29T03:30:00+02:00"]
    assert all(d["schedule"] is None for d in converted.values())
    # Every one is a definition the service accepts (sync_dags' validation).
    parsed = definitions.parse_document(list(converted.values()), file="timed.py")
    assert len(parsed) == 9


def test_a_schedule_the_service_cannot_run_is_refused_naming_the_file(tmp_path):
    (tmp_path / "always.py").write_text(
        textwrap.dedent(
            """
            import pendulum
            from airflow.sdk import dag, task

            @dag(dag_id="always", schedule="@continuous",
                 start_date=pendulum.datetime(2026, 1, 1), max_active_runs=1)
            def always():
                task(task_id="t")(lambda: None)()

            always()
            """
        )
    )
    refused = _convert(tmp_path)
    assert "always.py" not in refused
    error = refused["import_errors"]["always.py"]
    assert "always.py" in error and "'always'" in error
    assert "ContinuousTimetable" in error and "--manual-only" in error
    synced = _convert(tmp_path, manual_only=True)
    assert synced["always.py"][0]["schedule"] is None
    assert "timetable" not in synced["always.py"][0]


@pytest.mark.django_db
def test_sync_endpoint_is_idempotent_and_refuses_a_bad_file_alone(client, examples, settings):
    settings.DAG_SYNC_KEY = "k"
    headers = {"Authorization": "Bearer k"}
    body = {"files": [{"file": f, "definitions": d} for f, d in examples.items()]}

    def sync(payload):
        return client.post(
            "/execution/dags/sync", payload, content_type="application/json", headers=headers
        )

    first = sync(body)
    assert first.status_code == 200, first.content
    assert first.json()["dags_created"] == 8
    assert Dag.objects.get(dag_id="af_consumer").fileloc == "consumer.py"
    assert Task.objects.filter(dag_id="af_branch").count() == 4
    assert sync(body).json()["dags_unchanged"] == 8

    before = app_table_counts()
    broken = {
        "files": [
            *body["files"],
            {
                "file": "bad.py",
                "definitions": [{"dag_id": "x", "tasks": [{"task_id": "t", "colour": 1}]}],
            },
        ]
    }
    # Issue 39: the file the service refuses is an import error of its own, naming the Dag, the
    # task and the attribute; every other file syncs (here: unchanged).
    answered = sync(broken)
    assert answered.status_code == 200, answered.content
    assert answered.json()["dags_unchanged"] == 8
    assert answered.json()["import_errors"] == ["bad.py"]
    (error,) = DagImportError.objects.all()
    assert error.filename == "bad.py"
    assert "Dag 'x', task 't', attribute 'colour'" in error.stack_trace
    after = app_table_counts()
    assert {t: after[t] - before[t] for t in before if after[t] != before[t]} == {
        "assets_app_dagimporterror": 1,
        "assets_app_auditentry": 1,
        "assets_app_audittarget": 8,
    }
    assert sync(broken).json()["dags_unchanged"] == 8  # replayed: nothing more written
    assert DagImportError.objects.count() == 1
    assert (
        client.post("/execution/dags/sync", body, content_type="application/json").status_code
        == 401
    )


@pytest.mark.django_db
def test_mapped_tasks_become_expand_definitions_the_service_syncs(tmp_path):
    (tmp_path / "fanout.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="fanout", schedule=None)
            def fanout():
                @task
                def files():
                    return ["a", "b"]

                @task(retries=2)
                def each(path):
                    return path

                @task
                def square(x):
                    return x * x

                @task
                def total(values):
                    return sum(values)

                @task
                def pairs():
                    return [{"x": 1}, {"x": 2}]

                @task(task_id="grid")
                def grid(x, y):
                    return x * y

                @task(task_id="by_kwargs")
                def by_kwargs(x):
                    return x

                @task(task_id="literal_kwargs")
                def literal_kwargs(x):
                    return x

                paths = files()
                total(each.expand(path=paths))
                by_kwargs.override(task_id="mapped_through").expand(x=paths.map(str.upper))
                by_kwargs.override(task_id="kwargs_through_map").expand_kwargs(
                    paths.map(lambda f: {"x": f})
                )
                square.expand(x=[1, 2, 3])
                grid.expand(x=[1, 2, 3], y=[10, 20])
                by_kwargs.expand_kwargs(pairs())
                literal_kwargs.expand_kwargs([{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}])

            fanout()
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    tasks = {t["task_id"]: t for t in dag["tasks"]}
    assert tasks["each"]["expand"] == {"path": {"xcom": "files"}}
    assert tasks["each"]["upstream"] == ["files"] and tasks["each"]["retries"] == 2
    assert tasks["square"]["expand"] == {"x": [None, None, None]}
    # The service counts map indexes; the worker resolves each one's arguments (Airflow's SDK):
    # a cross product of literals is their lengths multiplied, expand_kwargs one per dict.
    assert tasks["grid"]["expand"] == {"x": [None] * 6}
    assert tasks["by_kwargs"]["expand"] == {"kwargs": {"xcom": "pairs"}}
    assert tasks["literal_kwargs"]["expand"] == {"kwargs": [None] * 4}
    # .map(f) keeps the length of the value it maps: the service counts over files' XCom.
    assert tasks["mapped_through"]["expand"] == {"x": {"xcom": "files"}}
    assert tasks["kwargs_through_map"]["expand"] == {"kwargs": {"xcom": "files"}}
    assert "expand" not in tasks["total"] and "expand" not in tasks["files"]
    definitions.sync_definitions(dags=definitions.parse_document(dag, file="fanout.py"))
    stored = Task.objects.filter(dag_id="fanout")
    assert {(t.task_id, t.map_length, t.map_upstream) for t in stored if t.is_mapped} == {
        ("each", None, "files"),
        ("square", 3, ""),
        ("grid", 6, ""),
        ("by_kwargs", None, "pairs"),
        ("literal_kwargs", 4, ""),
        ("mapped_through", None, "files"),
        ("kwargs_through_map", None, "files"),
    }


@pytest.mark.django_db
def test_a_mapping_over_a_mapped_tasks_output_converts_and_syncs(tmp_path):
    """Second order (Airflow's example_task_mapping_second_order), also through `.map(f)` and
    `expand_kwargs`: the service counts the upstream's pushed return values."""
    (tmp_path / "second.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="second", schedule=None)
            def second():
                @task
                def numbers():
                    return [1, 2, 3]

                @task
                def times_2(num):
                    return num * 2

                @task
                def add_10(num):
                    return num + 10

                doubled = times_2.expand(num=numbers())
                add_10.expand(num=doubled)
                add_10.override(task_id="through_map").expand(num=doubled.map(abs))
                add_10.override(task_id="as_kwargs").expand_kwargs(
                    doubled.map(lambda n: {"num": n})
                )

            second()
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    tasks = {t["task_id"]: t for t in dag["tasks"]}
    assert tasks["add_10"]["expand"] == {"num": {"xcom": "times_2"}}
    assert tasks["through_map"]["expand"] == {"num": {"xcom": "times_2"}}
    assert tasks["as_kwargs"]["expand"] == {"kwargs": {"xcom": "times_2"}}
    definitions.sync_definitions(dags=definitions.parse_document(dag, file="second.py"))
    stored = Task.objects.filter(dag_id="second", task_id__in=["add_10", "as_kwargs"])
    assert {(t.task_id, t.map_upstream) for t in stored} == {
        ("add_10", "times_2"),
        ("as_kwargs", "times_2"),
    }


@pytest.mark.django_db
def test_zip_and_concat_become_their_definition_forms_the_service_syncs(tmp_path):
    """Issue 39: `a.zip(b, ...)` (with or without a fillvalue) and `a.concat(b, ...)` over task
    outputs, also through `.map(f)` on either side, and `.expand_kwargs` over them."""
    (tmp_path / "combined.py").write_text(
        textwrap.dedent(
            """
            import datetime
            from airflow.sdk import dag, task

            @dag(dag_id="combined", schedule=None)
            def combined():
                @task
                def numbers():
                    return [1, 2, 3]

                @task
                def letters():
                    return ["a", "b"]

                @task
                def show(v):
                    return v

                n, l = numbers(), letters()
                doubled = show.override(task_id="doubled").expand(v=n)
                show.override(task_id="zipped").expand(v=n.zip(l.map(lambda s: s.upper())))
                show.override(task_id="filled").expand(v=n.zip(l, fillvalue=None))
                show.override(task_id="odd_fill").expand(
                    v=n.zip(l, fillvalue=datetime.date(2024, 1, 1))
                )
                show.override(task_id="joined").expand(v=n.concat(l, doubled).map(str))
                show.override(task_id="as_kwargs").expand_kwargs(
                    n.zip(l).map(lambda p: {"v": p})
                )

            combined()
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    expands = {t["task_id"]: t["expand"] for t in dag["tasks"] if "expand" in t}
    n, ls, doubled = {"xcom": "numbers"}, {"xcom": "letters"}, {"xcom": "doubled"}
    assert expands == {
        "doubled": {"v": n},
        "zipped": {"v": {"zip": [n, ls]}},
        "filled": {"v": {"zip": [n, ls], "fillvalue": None}},
        "odd_fill": {"v": {"zip": [n, ls], "fillvalue": "datetime.date(2024, 1, 1)"}},
        "joined": {"v": {"concat": [n, ls, doubled]}},
        "as_kwargs": {"kwargs": {"zip": [n, ls]}},
    }
    definitions.sync_definitions(dags=definitions.parse_document(dag, file="combined.py"))
    stored = Task.objects.filter(dag_id="combined").exclude(map_combine="")
    assert {(t.task_id, t.map_combine, tuple(t.map_sources)) for t in stored} == {
        ("zipped", "zip", ("numbers", "letters")),
        ("filled", "zip_longest", ("numbers", "letters")),
        ("odd_fill", "zip_longest", ("numbers", "letters")),
        ("joined", "concat", ("numbers", "letters", "doubled")),
        ("as_kwargs", "zip", ("numbers", "letters")),
    }


@pytest.mark.parametrize(
    ("body", "how"),
    [
        ("square.expand(x=numbers(), y=[2])", "over 2 arguments, one of them an XCom"),
        (
            "square.expand(x=numbers().concat(numbers().zip(numbers())))",
            "over a concat holding ZipXComArg",
        ),
        (
            "square.expand(x=numbers().zip(numbers()).concat(numbers()))",
            "over a concat holding ZipXComArg",
        ),
    ],
    ids=["cross_product_xcom", "zip_in_concat", "concat_of_zip"],
)
def test_a_mapping_the_service_cannot_run_is_refused_naming_the_task(tmp_path, body, how):
    (tmp_path / "fanout.py").write_text(
        textwrap.dedent(
            f"""
            from airflow.sdk import dag, task

            @dag(dag_id="fanout", schedule=None)
            def fanout():
                @task
                def numbers():
                    return [1, 2]

                @task(task_id="square")
                def square(x, y=0):
                    return x * x

                {body}

            fanout()
            """
        )
    )
    error = _convert(tmp_path)["import_errors"]["fanout.py"]
    assert "fanout.py" in error and "'fanout'" in error
    assert f"maps task 'square' {how}" in error, error


@pytest.mark.django_db
def test_tasks_of_a_mapped_task_group_become_map_group_definitions_the_service_syncs(tmp_path):
    (tmp_path / "groups.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task, task_group

            @dag(dag_id="groups", schedule=None)
            def groups():
                @task
                def numbers():
                    return [1, 2, 3]

                @task
                def double(x):
                    return 2 * x

                @task
                def add(x, y):
                    return x + y

                @task
                def total(values):
                    return sum(values)

                @task_group
                def per_number(x):
                    return add(double(x), x)

                @task_group
                def per_literal(x, y):
                    return add.override(task_id="plus")(double.override(task_id="twice")(x), y)

                total(per_number.expand(x=numbers()))
                per_literal.partial(y=1).expand(x=[10, 20])

            groups()
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    tasks = {t["task_id"]: t for t in dag["tasks"]}
    over_numbers = {"x": {"xcom": "numbers"}}
    assert tasks["per_number.double"]["expand"] == over_numbers
    assert tasks["per_number.double"]["upstream"] == ["numbers"]
    assert tasks["per_number.add"]["expand"] == over_numbers
    # add takes the group's x too: numbers is upstream of it, as Airflow links it.
    assert tasks["per_number.add"]["upstream"] == ["numbers", "per_number.double"]
    assert {tasks[t]["map_group"] for t in ("per_number.double", "per_number.add")} == {
        "per_number"
    }
    assert tasks["per_literal.twice"]["expand"] == {"x": [None, None]}
    assert tasks["per_literal.plus"]["map_group"] == "per_literal"
    assert "map_group" not in tasks["total"] and "expand" not in tasks["total"]
    # Every group with its tasks (Airflow's task_group_dict), for reads by task_group_id.
    assert dag["task_groups"] == {
        "per_literal": ["per_literal.plus", "per_literal.twice"],
        "per_number": ["per_number.add", "per_number.double"],
    }
    definitions.sync_definitions(dags=definitions.parse_document(dag, file="groups.py"))
    assert Dag.objects.get(dag_id="groups").task_groups == dag["task_groups"]
    stored = Task.objects.filter(dag_id="groups").exclude(map_group="")
    assert {(t.task_id, t.map_length, t.map_upstream, t.map_group) for t in stored} == {
        ("per_number.double", None, "numbers", "per_number"),
        ("per_number.add", None, "numbers", "per_number"),
        ("per_literal.twice", 2, "", "per_literal"),
        ("per_literal.plus", 2, "", "per_literal"),
    }


@pytest.mark.parametrize(
    ("body", "how"),
    [
        (
            """
            @task_group
            def inner(y):
                square.override(task_id="sq")(y)

            @task_group
            def outer(x):
                inner.expand(y=[1, 2])

            outer.expand(x=[1, 2])
            """,
            "maps task 'outer.inner.sq' in the mapped task group 'outer.inner' inside another",
        ),
        (
            """
            @task_group
            def g(x):
                square(x)

            g.expand(x=numbers().zip(numbers().concat(numbers())))
            """,
            "maps task 'g.square' over a zip holding ConcatXComArg",
        ),
    ],
    # (A mapped task inside a mapped group the Task SDK itself refuses: "operator expansion
    # in an expanded task group is not yet supported".)
    ids=["group_in_group", "group_over_zip_of_concat"],
)
def test_a_mapped_group_the_service_cannot_run_is_refused_naming_the_task(tmp_path, body, how):
    (tmp_path / "nested.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task, task_group

            @dag(dag_id="nested", schedule=None)
            def nested():
                @task
                def numbers():
                    return [1, 2]

                @task(task_id="square")
                def square(x):
                    return x * x
            BODY
            nested()
            """
        ).replace("BODY", textwrap.indent(textwrap.dedent(body), "    "))
    )
    error = _convert(tmp_path)["import_errors"]["nested.py"]
    assert "'nested'" in error and how in error, error


def test_a_file_that_does_not_import_is_reported_and_the_others_still_convert(tmp_path):
    """Issue 27: one broken file no longer refuses the folder; it is the import error that the
    sync reports (Airflow's own stack trace), beside the files that converted."""
    (tmp_path / "fine.py").write_text(
        "from airflow.sdk import dag, task\n\n"
        "@dag(dag_id='fine', schedule=None)\n"
        "def fine():\n    task(task_id='t')(lambda: None)()\n\nfine()\n"
    )
    (tmp_path / "broken.py").write_text("from airflow.sdk import dag\ndef broken(:\n")
    (tmp_path / "missing.py").write_text("from airflow.sdk import dag\nimport no_such_module_x\n")
    converted = _convert(tmp_path)
    assert [d["dag_id"] for d in converted["fine.py"]] == ["fine"]
    errors = converted.pop("import_errors")
    assert set(converted) == {"fine.py"} and set(errors) == {"broken.py", "missing.py"}
    assert "SyntaxError" in errors["broken.py"]
    assert (
        "ModuleNotFoundError" in errors["missing.py"] and "no_such_module_x" in errors["missing.py"]
    )


ASSET_OR_TIME_DAGS = """
import datetime
import pendulum
from dateutil.relativedelta import relativedelta
from airflow.sdk import Asset, dag, task
from airflow.sdk.definitions.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable


def make(dag_id, schedule):
    @dag(dag_id=dag_id, schedule=schedule,
         start_date=pendulum.datetime(2026, 1, 1, tz="Europe/Zurich"))
    def d():
        task(task_id="t")(lambda: None)()

    d()


make("aot_cron", AssetOrTimeSchedule(
    timetable=CronTriggerTimetable("0 3 * * *", timezone="Europe/Zurich"),
    assets=(Asset("aot_a") & Asset("aot_b"))))
make("aot_list", AssetOrTimeSchedule(
    timetable=DeltaTriggerTimetable(datetime.timedelta(hours=6)),
    assets=[Asset("aot_a"), Asset("aot_c")]))
"""


def test_asset_or_time_schedule_becomes_schedule_and_timetable(tmp_path):
    """Airflow's AssetOrTimeSchedule: its asset condition is the `schedule` (a list of assets
    is Airflow's AssetAll), its timetable the `timetable`, in mode asset_or_time."""
    from assets_app.definitions import sync as definitions

    (tmp_path / "aot.py").write_text(ASSET_OR_TIME_DAGS)
    converted = {d["dag_id"]: d for d in _convert(tmp_path)["aot.py"]}
    cron = converted["aot_cron"]
    assert cron["schedule"] == {
        "all": [{"name": "aot_a", "uri": "aot_a"}, {"name": "aot_b", "uri": "aot_b"}]
    }
    assert cron["timetable"] == {
        "kind": "cron_trigger",
        "cron": "0 3 * * *",
        "timezone": "Europe/Zurich",
        "interval": 0.0,
        "run_immediately": False,
    }
    assert cron["schedule_mode"] == "asset_or_time"
    listed = converted["aot_list"]
    assert listed["schedule"]["all"][1] == {"name": "aot_c", "uri": "aot_c"}
    assert listed["timetable"]["kind"] == "delta_trigger"
    parsed = definitions.parse_document(list(converted.values()), file="aot.py")
    assert {(d.schedule_mode, d.timetable is not None, d.schedule is not None) for d in parsed} == {
        ("asset_or_time", True, True)
    }
    # One whose time half the service cannot run is refused naming the file and Dag.
    (tmp_path / "aot.py").write_text(
        ASSET_OR_TIME_DAGS
        + 'make("aot_calendar", AssetOrTimeSchedule('
        + "timetable=DeltaTriggerTimetable(relativedelta(months=1)), assets=[Asset('aot_a')]))\n"
    )
    refused = _convert(tmp_path)
    error = refused["import_errors"]["aot.py"]
    assert "aot.py" in error and "'aot_calendar'" in error
    assert "aot_calendar" not in {d["dag_id"] for d in refused["aot.py"]}  # the others sync


@pytest.mark.django_db
def test_a_tag_sets_the_dags_xcom_read_scope(tmp_path):
    """Issue 26: an Airflow DAG file opens wider XCom reads with a tag; without one the Dag's
    tokens read their own run only."""
    (tmp_path / "scoped.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="wide_reader", schedule=None, tags=["xcom_read_scope:dag", "team"])
            def wide_reader():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="narrow_reader", schedule=None)
            def narrow_reader():
                task(task_id="t")(lambda: None)()

            wide_reader()
            narrow_reader()
            """
        )
    )
    parsed = {d["dag_id"]: d for d in _convert(tmp_path)["scoped.py"]}
    assert parsed["wide_reader"]["xcom_read_scope"] == "dag"
    assert "xcom_read_scope" not in parsed["narrow_reader"]
    definitions.sync_definitions(
        dags=[
            d
            for raw in parsed.values()
            for d in definitions.parse_document(raw, file="scoped.py", fileloc="scoped.py")
        ]
    )
    assert dict(Dag.objects.values_list("dag_id", "xcom_read_scope")) == {
        "wide_reader": "dag",
        "narrow_reader": "run",
    }


@pytest.mark.django_db
def test_a_tag_sets_the_dags_consumption_and_a_bad_one_is_that_files_import_error(tmp_path):
    """Issue 28: `consumption:per_event` / `consumption:max_events=N` on an Airflow Dag; a tag
    of another shape is an import error of its file naming the tag, the other files sync."""
    (tmp_path / "consumers.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import Asset, dag, task

            @dag(dag_id="each", schedule=[Asset("orders")], tags=["consumption:per_event"])
            def each():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="fifty", schedule=[Asset("orders")], tags=["consumption:max_events=50"])
            def fifty():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="all_of_them", schedule=[Asset("orders")])
            def all_of_them():
                task(task_id="t")(lambda: None)()

            each()
            fifty()
            all_of_them()
            """
        )
    )
    (tmp_path / "bad.py").write_text(
        "from airflow.sdk import Asset, dag, task\n"
        "@dag(dag_id='bad', schedule=[Asset('orders')], tags=['consumption:max_events=0'])\n"
        "def bad():\n"
        "    task(task_id='t')(lambda: None)()\n"
        "bad()\n"
    )
    converted = _convert(tmp_path)
    assert "consumption:max_events=0" in converted["import_errors"]["bad.py"]
    parsed = {d["dag_id"]: d for d in converted["consumers.py"]}
    assert parsed["each"]["consumption"] == "per_event"
    assert parsed["fifty"]["consumption"] == {"max_events": 50}
    assert "consumption" not in parsed["all_of_them"]
    definitions.sync_definitions(
        dags=[
            d
            for raw in parsed.values()
            for d in definitions.parse_document(raw, file="consumers.py", fileloc="consumers.py")
        ]
    )
    assert dict(Dag.objects.values_list("dag_id", "max_events_per_run")) == {
        "each": 1,
        "fifty": 50,
        "all_of_them": None,
    }


@pytest.mark.django_db(transaction=True)
def test_an_asset_watcher_on_a_rabbitmq_queue_becomes_the_services_queue_watcher(tmp_path):
    """Issue 28: Airflow's `AssetWatcher(name, MessageQueueTrigger(...))` on scheduled assets
    becomes the definition's `watchers` (one watcher name on two assets: one consumer feeding
    both; the URI form and the `scheme` form); a message published to the queue registers an
    event on both assets. A trigger the service cannot consume (another scheme, another
    trigger class) is an import error of its file naming the watcher."""
    queue = "test-dag-file-watcher"
    (tmp_path / "watched.py").write_text(
        textwrap.dedent(
            f"""
            from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
            from airflow.sdk import Asset, AssetWatcher, dag, task

            shop = MessageQueueTrigger(
                queue="amqp://guest:guest@localhost:5672/%2F/{queue}", routing_key="shop.*"
            )
            orders = Asset("orders", watchers=[AssetWatcher(name="shop", trigger=shop)])
            refunds = Asset("refunds", watchers=[AssetWatcher(name="shop", trigger=shop)])

            @dag(dag_id="watched", schedule=(orders | refunds))
            def watched():
                task(task_id="t")(lambda: None)()

            by_scheme = MessageQueueTrigger(
                scheme="amqp", queue_name="{queue}-2", body_field="kind", body_value="paid"
            )
            paid = Asset("paid", watchers=[AssetWatcher(name="paid", trigger=by_scheme)])

            @dag(dag_id="paid_report", schedule=[paid])
            def paid_report():
                task(task_id="t")(lambda: None)()

            watched()
            paid_report()
            """
        )
    )
    (tmp_path / "kafka.py").write_text(
        textwrap.dedent(
            """
            from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
            from airflow.sdk import Asset, AssetWatcher, dag, task

            trigger = MessageQueueTrigger(scheme="kafka", topics=["t"])
            a = Asset("k", watchers=[AssetWatcher(name="kafka_topic", trigger=trigger)])

            @dag(dag_id="on_kafka", schedule=[a])
            def on_kafka():
                task(task_id="t")(lambda: None)()

            on_kafka()
            """
        )
    )
    (tmp_path / "files.py").write_text(
        textwrap.dedent(
            """
            from airflow.providers.standard.triggers.file import FileDeleteTrigger
            from airflow.sdk import Asset, AssetWatcher, dag, task

            a = Asset("f", watchers=[AssetWatcher(name="gone", trigger=FileDeleteTrigger("/x"))])

            @dag(dag_id="on_file", schedule=[a])
            def on_file():
                task(task_id="t")(lambda: None)()

            on_file()
            """
        )
    )
    converted = _convert(tmp_path)
    errors = converted["import_errors"]
    assert "AssetWatcher 'kafka_topic' on 'k' has scheme 'kafka'" in errors["kafka.py"]
    assert "AssetWatcher 'gone' on 'f' uses FileDeleteTrigger" in errors["files.py"]
    parsed = {d["dag_id"]: d for d in converted["watched.py"]}
    assert parsed["watched"]["watchers"] == [
        {
            "name": "shop",
            "queue": queue,
            "broker_url": "amqp://guest:guest@localhost:5672/%2F",
            "routing_key": "shop.*",
            "assets": [{"name": "orders", "uri": "orders"}, {"name": "refunds", "uri": "refunds"}],
        }
    ]
    assert parsed["paid_report"]["watchers"] == [
        {
            "name": "paid",
            "queue": f"{queue}-2",
            "body_field": "kind",
            "body_value": "paid",
            "assets": [{"name": "paid", "uri": "paid"}],
        }
    ]

    definitions.sync_documents(documents=[("watched.py", raw) for raw in parsed.values()])
    shop = QueueWatcher.objects.get(name="shop")
    assert QueueWatcher.objects.get(name="paid").broker_url == ""  # the service's setting
    try:
        rabbitmq.publish(queue, [rabbitmq.message({"id": 7}, routing_key="shop.paid")])
        assert consume(shop, 1) == 1
    finally:
        rabbitmq.delete(queue)
        rabbitmq.delete(f"{queue}-2")
    assert sorted(AssetEvent.objects.values_list("asset__name", flat=True)) == [
        "orders",
        "refunds",
    ]


@pytest.mark.django_db
def test_a_refused_file_is_added_to_the_stored_import_errors_when_none_are_sent():
    """Issue 39: the whole sync was refused (0 Dags) for one file's trigger rule the service does
    not know (`all_done_setup_success`, Airflow's example_setup_teardown*.py, honoured since;
    `all_done_min_one_success` stands in for it here). Now that file is
    an import error naming its Dag, task and attribute; the others sync, and import errors the
    worker did not report again (None: not sent) stay."""
    DagImportError.objects.create(
        filename="other.py", stack_trace="ImportError: x", timestamp=timezone.now()
    )
    good = [{"dag_id": "fine", "tasks": [{"task_id": "a"}]}]
    bad = [
        {
            "dag_id": "setup_teardown",
            "tasks": [
                {"task_id": "setup"},
                {
                    "task_id": "work",
                    "upstream": ["setup"],
                    "trigger_rule": "all_done_min_one_success",
                },
            ],
        }
    ]
    result = definitions.sync_documents(documents=[("good.py", good), ("teardown.py", bad)])
    assert result.dags_created == 1 and Dag.objects.filter(dag_id="fine").exists()
    assert not Dag.objects.filter(dag_id="setup_teardown").exists()
    errors = dict(DagImportError.objects.values_list("filename", "stack_trace"))
    assert errors["other.py"] == "ImportError: x"
    assert errors["teardown.py"].startswith(
        "refused by the asset service (Dag 'setup_teardown', task 'work', attribute "
        "'trigger_rule'): "
    )
    assert "all_done_min_one_success" in errors["teardown.py"]


@pytest.mark.django_db
def test_a_dag_file_silent_on_pause_leaves_it_to_the_services_setting(tmp_path, settings):
    # Issue 39: is_paused_upon_creation=None is Airflow's "use dags_are_paused_at_creation"
    # (True by default); the worker no longer sends is_paused false for it.
    (tmp_path / "paused.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import dag, task

            @dag(dag_id="silent", schedule=None)
            def silent():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="runs", schedule=None, is_paused_upon_creation=False)
            def runs():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="held", schedule=None, is_paused_upon_creation=True)
            def held():
                task(task_id="t")(lambda: None)()

            silent()
            runs()
            held()
            """
        )
    )
    converted = {d["dag_id"]: d for d in _convert(tmp_path)["paused.py"]}
    assert "is_paused" not in converted["silent"]
    assert (converted["runs"]["is_paused"], converted["held"]["is_paused"]) == (False, True)
    definitions.sync_documents(documents=[("paused.py", list(converted.values()))])
    paused = dict(Dag.objects.values_list("dag_id", "is_paused"))
    assert paused == {"silent": True, "runs": False, "held": True}


_ALLOWED = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id="{dag_id}", schedule=None, allowed_run_types={allowed}):
    EmptyOperator(task_id="t")
"""


@pytest.mark.django_db
def test_allowed_run_types_are_carried_and_airflows_own_check_refuses_a_bad_one(tmp_path):
    (tmp_path / "limited.py").write_text(
        _ALLOWED.format(dag_id="limited", allowed=["manual", "backfill"])
    )
    (tmp_path / "broken.py").write_text(_ALLOWED.format(dag_id="broken", allowed=["scheduled"]))
    converted = _convert(tmp_path)
    # Airflow's Dag refuses the second one while the file is parsed (its import error).
    assert (
        "must include MANUAL when the Dag has no schedule defined"
        in (converted["import_errors"]["broken.py"])
    )
    (limited,) = converted["limited.py"]
    assert limited["allowed_run_types"] == ["backfill", "manual"]
    definitions.sync_documents(documents=[("limited.py", [limited])])
    assert Dag.objects.get(dag_id="limited").allowed_run_types == ["backfill", "manual"]


@pytest.mark.django_db
def test_fail_fast_is_carried_and_airflows_own_check_refuses_another_trigger_rule(tmp_path):
    for name, rule in (("fast", "all_success"), ("loose", "all_done")):
        (tmp_path / f"{name}.py").write_text(
            "from airflow.sdk import DAG\n"
            "from airflow.providers.standard.operators.empty import EmptyOperator\n"
            f"with DAG(dag_id={name!r}, schedule=None, fail_fast=True):\n"
            f"    EmptyOperator(task_id='t', trigger_rule={rule!r})\n"
        )
    converted = _convert(tmp_path)
    assert (
        "A 'fail_fast' dag can only have TriggerRule.ALL_SUCCESS trigger rule"
        in (converted["import_errors"]["loose.py"])
    )
    (fast,) = converted["fast.py"]
    assert fast["fail_fast"] is True
    definitions.sync_documents(documents=[("fast.py", [fast])])
    assert Dag.objects.get(dag_id="fast").fail_fast


@pytest.mark.django_db
def test_dag_callbacks_are_marked_on_the_definition(tmp_path):
    """Issue 39: which Dag-level callbacks a Dag has (Airflow's `has_on_*_callback`) is carried;
    a Dag without any says nothing."""
    (tmp_path / "cb.py").write_text(
        "from airflow.sdk import DAG\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "def note(context):\n    pass\n"
        "with DAG(dag_id='cb', schedule=None, on_success_callback=note,\n"
        "         on_failure_callback=[note]):\n"
        "    EmptyOperator(task_id='t')\n"
        "with DAG(dag_id='plain', schedule=None):\n"
        "    EmptyOperator(task_id='t')\n"
    )
    converted = _convert(tmp_path)
    cb, plain = sorted(converted["cb.py"], key=lambda d: d["dag_id"])
    assert (cb["has_on_success_callback"], cb["has_on_failure_callback"]) == (True, True)
    assert "has_on_success_callback" not in plain and "has_on_failure_callback" not in plain
    definitions.sync_documents(documents=[("cb.py", [cb, plain])])
    stored = Dag.objects.get(dag_id="cb")
    assert stored.has_on_success_callback and stored.has_on_failure_callback
    assert not Dag.objects.get(dag_id="plain").has_on_failure_callback


@pytest.mark.django_db
def test_what_a_dag_says_about_itself_is_carried_whatever_its_schedule(tmp_path):
    """Issue 39: every tag (the service's own `xcom_read_scope:` ones too, ordinary tags to
    Airflow), `doc_md`, each task's `owner` (through `default_args` too) and `doc_md`, and the
    zone and dates of a Dag without a time schedule (manual or asset), as Airflow's Dag details
    show them, are carried and stored; such a Dag still has no next run on a clock."""
    (tmp_path / "described.py").write_text(
        textwrap.dedent(
            '''
            import pendulum
            from airflow.sdk import Asset, dag, task

            ZURICH = pendulum.timezone("Europe/Zurich")

            @dag(
                dag_id="described",
                schedule=None,
                start_date=pendulum.datetime(2024, 3, 1, tz=ZURICH),
                end_date=pendulum.datetime(2030, 1, 1, tz=ZURICH),
                tags=["etl", "team", "xcom_read_scope:dag"],
                default_args={"owner": "data-eng"},
                doc_md="""
                # Described
                Says what it is.
                """,
            )
            def described():
                @task(owner="qa")
                def check():
                    """Checks the orders."""

                task(task_id="load")(lambda: None)() >> check()

            @dag(dag_id="on_assets", schedule=[Asset("orders")],
                 start_date=pendulum.datetime(2024, 1, 1, tz="America/New_York"))
            def on_assets():
                task(task_id="t")(lambda: None)()

            @dag(dag_id="plain", schedule=None)
            def plain():
                task(task_id="t")(lambda: None)()

            described()
            on_assets()
            plain()
            '''
        )
    )
    converted = _convert(tmp_path)
    assert converted["import_errors"] == {}
    parsed = {d["dag_id"]: d for d in converted["described.py"]}
    described = parsed["described"]
    assert described["tags"] == ["etl", "team", "xcom_read_scope:dag"]
    assert described["xcom_read_scope"] == "dag"
    assert "# Described" in described["doc_md"]
    tasks = {t["task_id"]: t for t in described["tasks"]}
    assert tasks["load"]["owner"] == "data-eng" and tasks["check"]["owner"] == "qa"
    assert tasks["check"]["doc_md"] == "Checks the orders."
    assert described["timezone"] == "Europe/Zurich"
    assert described["start_date"] == "2024-02-29T23:00:00+00:00"  # the SDK keeps UTC
    assert described["end_date"] == "2029-12-31T23:00:00+00:00"
    assert parsed["on_assets"]["timezone"] == "America/New_York"
    assert "timetable" not in described and "timetable" not in parsed["on_assets"]
    # Airflow's defaults (UTC, no dates, no catchup) are not sent.
    assert not {"timezone", "start_date", "end_date", "catchup"} & set(parsed["plain"])
    definitions.sync_definitions(
        dags=[
            d
            for raw in parsed.values()
            for d in definitions.parse_document(raw, file="described.py", fileloc="described.py")
        ]
    )
    dag = Dag.objects.get(dag_id="described")
    assert (dag.owners, dag.timezone, dag.timetable) == ("data-eng, qa", "Europe/Zurich", None)
    assert dag.start_date.isoformat() == "2024-02-29T23:00:00+00:00"
    assert dag.next_dagrun is None and dag.next_dagrun_create_after is None
    on_assets = Dag.objects.get(dag_id="on_assets")
    assert on_assets.start_date.isoformat() == "2024-01-01T05:00:00+00:00"
    assert on_assets.next_dagrun_create_after is None


def test_a_dag_file_importing_a_helper_module_beside_it_converts(tmp_path):
    """Issue 39: Airflow's dag-processor (its BundleDagBag) puts the Dag folder on `sys.path`,
    so a DAG file may import a helper module from it; the worker's parse does the same."""
    (tmp_path / "shared_names.py").write_text('OWNER = "data-eng"\nTAGS = ["etl"]\n')
    (tmp_path / "uses_helper.py").write_text(
        "from airflow.sdk import dag, task\n"
        "from shared_names import OWNER, TAGS\n"
        "@dag(dag_id='uses_helper', schedule=None, tags=TAGS, default_args={'owner': OWNER})\n"
        "def uses_helper():\n"
        "    task(task_id='t')(lambda: None)()\n"
        "uses_helper()\n"
    )
    converted = _convert(tmp_path)
    assert converted["import_errors"] == {}
    (definition,) = converted["uses_helper.py"]
    assert definition["tags"] == ["etl"]
    assert definition["tasks"] == [{"task_id": "t", "retries": 0, "owner": "data-eng"}]


_WEIGHTS = """
import json
from types import SimpleNamespace
from airflow.sdk import DAG, BaseOperator
from airflow.task.priority_strategy import validate_and_load_priority_weight_strategy as load
exec(open("weights.py").read())
print(json.dumps({
    t.task_id: load(t.weight_rule).get_weight(SimpleNamespace(task=t)) for t in dag.tasks
}))
"""

WEIGHT_DAG = """
from airflow.sdk import DAG, BaseOperator
from airflow.task.priority_strategy import _UpstreamPriorityWeightStrategy

with DAG("weights", schedule=None) as dag:
    a = BaseOperator(task_id="a", priority_weight=2)
    b = BaseOperator(task_id="b", priority_weight=3, weight_rule="upstream")
    c = BaseOperator(task_id="c", priority_weight=5, weight_rule="absolute")
    d = BaseOperator(task_id="d", priority_weight=11, weight_rule=_UpstreamPriorityWeightStrategy())
    e = BaseOperator(task_id="e", priority_weight=7)
    big = BaseOperator(task_id="big", priority_weight=2**31 - 1)
    a >> [b, c] >> e >> d
    big >> a
"""


@pytest.mark.django_db
def test_priority_weights_are_totalled_at_sync_as_airflows_strategies(tmp_path):
    """The effective weights the sync stores are the ones Airflow's own priority strategies
    give the same tasks (a diamond counts a task once; a total past 2**31-1 is clamped)."""
    (tmp_path / "weights.py").write_text(WEIGHT_DAG)
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    airflow = json.loads(
        subprocess.run(
            [str(sdk_python()), "-c", _WEIGHTS],
            cwd=tmp_path,
            env={
                "PYTHONPATH": str(ROOT),
                "AIRFLOW_HOME": str(tmp_path / ".af"),
                "PATH": "/usr/bin",
            },
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    definitions.sync_documents(documents=[("weights.py", converted["weights.py"])])
    stored = dict(
        Task.objects.filter(dag_id="weights").values_list("task_id", "priority_weight_total")
    )
    # Airflow's strategy does not clamp a total; its operator clamps its own weight and the
    # database column is a 32-bit integer, so the service clamps the total likewise.
    assert stored == {k: max(-(2**31), min(2**31 - 1, v)) for k, v in airflow.items()}
    assert stored["a"] == 2 + 3 + 5 + 7 + 11  # e once, through b and through c
    assert stored["d"] == 2**31 - 1  # big's weight alone is the maximum


def test_a_custom_priority_weight_strategy_is_refused_naming_the_task(tmp_path):
    (tmp_path / "custom.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import DAG, BaseOperator
            from airflow.task.priority_strategy import PriorityWeightStrategy

            class Mine(PriorityWeightStrategy):
                def get_weight(self, ti):
                    return 3

            with DAG("custom", schedule=None):
                BaseOperator(task_id="t", weight_rule=Mine())
            """
        )
    )
    converted = _convert(tmp_path)
    assert "custom.py" not in converted
    assert "Dag 'custom', task 't': weight_rule" in converted["import_errors"]["custom.py"]
    assert "custom priority weight strategy" in converted["import_errors"]["custom.py"]


def test_pool_and_pool_slots_are_carried(tmp_path):
    (tmp_path / "pooled.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import DAG, BaseOperator

            with DAG("pooled", schedule=None, default_args={"pool": "gpu"}):
                BaseOperator(task_id="big", pool_slots=2)
                BaseOperator(task_id="plain", pool="default_pool")
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    tasks = {t["task_id"]: t for t in dag["tasks"]}
    assert (tasks["big"]["pool"], tasks["big"]["pool_slots"]) == ("gpu", 2)
    assert tasks["plain"] == {"task_id": "plain", "retries": 0}  # Airflow's defaults: not sent
    (parsed,) = definitions.parse_document(dag, file="pooled.py")
    assert {t.task_id: (t.pool, t.pool_slots) for t in parsed.tasks} == {
        "big": ("gpu", 2),
        "plain": ("default_pool", 1),
    }


_QUEUES = """
import json
from airflow_worker.__main__ import _default_queues, _options
print(json.dumps({
    "given": _options(["--dags", ".", "--queues", "default, gpu"]).queues,
    "unset": _options(["--dags", "."]).queues,
    "default": _default_queues(),
}))
"""


def test_the_worker_claims_its_queues_default_airflows_default_queue(tmp_path):
    """`bin/airflow-worker --queues a,b`; without it, Airflow's `[operators] default_queue`
    as the worker's Airflow config gives it (here set through the environment)."""
    done = subprocess.run(
        [str(sdk_python()), "-c", _QUEUES],
        cwd=ROOT,
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW_HOME": str(tmp_path),
            "PATH": "/usr/bin",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": "celery",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "given": ["default", "gpu"],
        "unset": None,
        "default": ["celery"],
    }


_BUNDLE = """
import json, sys
from pathlib import Path
from airflow_worker.__main__ import _airflow_environment, _options
folder, logs = sys.argv[1], sys.argv[2]
default = _options(["--dags", folder]).bundle
options = _options(["--dags", folder, "--bundle", "team-a", "--logs", logs])
_airflow_environment(options)
from airflow.dag_processing.bundles.manager import DagBundlesManager
bundle = DagBundlesManager().get_bundle("team-a")
print(json.dumps({"default": default, "path": str(bundle.path)}))
"""


def test_the_worker_serves_its_bundle_as_airflows_local_bundle_of_that_name(tmp_path):
    """`bin/airflow-worker --bundle NAME` (default Airflow's `dags-folder`): the Task SDK
    loads a workload's Dag from the bundle its `bundle_info` names (the Dag's bundle), so the
    worker configures Airflow's local bundle over `--dags` under that name."""
    dags = tmp_path / "dags"
    dags.mkdir()
    done = subprocess.run(
        [str(sdk_python()), "-c", _BUNDLE, str(dags), str(tmp_path / "logs")],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "default": "dags-folder",
        "path": str(dags.resolve()),
    }


def test_queue_is_carried(tmp_path):
    (tmp_path / "queued.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import DAG, BaseOperator

            with DAG("queued", schedule=None):
                BaseOperator(task_id="train", queue="gpu")
                BaseOperator(task_id="plain", queue="default")
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    ((dag,),) = converted.values()
    tasks = {t["task_id"]: t for t in dag["tasks"]}
    assert tasks["train"]["queue"] == "gpu"
    assert "queue" not in tasks["plain"]  # Airflow's default: not sent


def test_run_and_task_limits_are_carried(tmp_path):
    (tmp_path / "limited.py").write_text(
        textwrap.dedent(
            """
            from airflow.sdk import DAG, BaseOperator

            with DAG("limited", schedule=None, max_active_tasks=3):
                BaseOperator(task_id="t", max_active_tis_per_dag=2, max_active_tis_per_dagrun=1)
            with DAG("unlimited", schedule=None):
                BaseOperator(task_id="t")
            """
        )
    )
    converted = _convert(tmp_path)
    assert converted.pop("import_errors") == {}
    dags = {d["dag_id"]: d for d in converted["limited.py"]}
    assert dags["limited"]["max_active_tasks"] == 3
    assert dags["limited"]["tasks"] == [
        {"task_id": "t", "retries": 0, "max_active_tis_per_dag": 2, "max_active_tis_per_dagrun": 1}
    ]
    # Airflow's [core] max_active_tasks_per_dag (16), the definition's default: not sent.
    assert "max_active_tasks" not in dags["unlimited"]
    parsed = definitions.parse_document(converted["limited.py"], file="limited.py")
    assert {d.dag_id: d.max_active_tasks for d in parsed} == {"limited": 3, "unlimited": 16}


_SOURCES = """
import json, sys
from pathlib import Path
from airflow_worker.dag_files import parse_folder
folder = parse_folder(Path(sys.argv[1]))
print(json.dumps({f.rel_path: f.payload() for f in folder.files}))
"""


def test_each_synced_file_carries_its_source_and_size(tmp_path):
    """Issue 45: the sync payload of each file that imported holds its text and size, as the
    worker's Airflow parse read the folder (the service's side: tests/api/test_dag_sources.py)."""
    text = (
        "from airflow.sdk import DAG\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n\n"
        "# é: not ASCII\n"
        "with DAG('with_source', schedule=None):\n"
        "    EmptyOperator(task_id='t')\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/with_source.py").write_text(text)
    done = subprocess.run(
        [str(sdk_python()), "-c", _SOURCES, str(tmp_path)],
        cwd=ROOT,
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW_HOME": str(tmp_path / ".airflow"),
            "PATH": "/usr/bin",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    payload = json.loads(done.stdout.strip().splitlines()[-1])["sub/with_source.py"]
    assert payload["source"] == text and payload["source_size"] == len(text.encode())
    assert [d["dag_id"] for d in payload["definitions"]] == ["with_source"]
