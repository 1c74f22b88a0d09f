"""Dynamic task mapping (issue 25) against real PostgreSQL: mapped tasks in the definition
format and their sync."""

import json

import pytest

from assets_app import definitions
from assets_app.models import Task

pytestmark = pytest.mark.django_db

FAN_OUT = {
    "dag_id": "fan_out",
    "tasks": [
        {"task_id": "list_files"},
        {"task_id": "each", "upstream": ["list_files"], "expand": {"path": {"xcom": "list_files"}}},
        {"task_id": "fixed", "expand": {"n": [1, "two", {"three": 3}]}},
        {"task_id": "none", "expand": {"n": []}},
        {"task_id": "sum", "upstream": ["each"]},
    ],
}


def sync(*dags: dict) -> definitions.SyncResult:
    return definitions.sync_definitions(
        dags=[d for dag in dags for d in definitions.parse_text(json.dumps(dag), file="t.json")]
    )


def mapping(dag_id: str) -> dict[str, tuple[int | None, str]]:
    return {
        task_id: (length, upstream)
        for task_id, length, upstream in Task.objects.filter(dag_id=dag_id).values_list(
            "task_id", "map_length", "map_upstream"
        )
    }


def test_sync_stores_what_each_task_maps_over_and_a_second_sync_changes_nothing():
    sync(FAN_OUT)
    assert mapping("fan_out") == {
        "list_files": (None, ""),
        "each": (None, "list_files"),
        "fixed": (3, ""),
        "none": (0, ""),
        "sum": (None, ""),
    }
    assert [t.task_id for t in Task.objects.filter(dag_id="fan_out") if t.is_mapped] == [
        "each",
        "fixed",
        "none",
    ]
    assert sync(FAN_OUT).tasks_unchanged == 5


def test_a_changed_expand_updates_the_task_and_a_removed_one_unmaps_it():
    sync(FAN_OUT)
    changed = json.loads(json.dumps(FAN_OUT))
    changed["tasks"][1].pop("expand")
    changed["tasks"][2]["expand"] = {"n": [1]}
    result = sync(changed)
    assert result.tasks_updated == 2
    assert mapping("fan_out")["each"] == (None, "")
    assert mapping("fan_out")["fixed"] == (1, "")


def test_a_literal_of_exactly_max_map_length_values_is_accepted(settings):
    settings.MAX_MAP_LENGTH = 4
    sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4]}}]})
    assert mapping("d") == {"a": (4, "")}
    with pytest.raises(definitions.DefinitionError, match="expand over 5 values, more than"):
        sync({"dag_id": "d", "tasks": [{"task_id": "a", "expand": {"x": [1, 2, 3, 4, 5]}}]})
    assert mapping("d") == {"a": (4, "")}
