"""The JSON Schema published for DAG authors (`docs/dag-definition.schema.json`): generated from
the models `sync_dags` validates with (`dag_schema`), committed up to date, and the examples
validate against it while a broken definition does not."""

import copy
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from pydantic import ValidationError

from assets_app.definitions import schema as dag_schema

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "docs" / "dag-definition.schema.json"
EXAMPLES = sorted((ROOT / "examples" / "dags").glob("*.json"))

try:
    import jsonschema
except ImportError:  # not installed: validate with the models the file is generated from
    jsonschema = None


def validate(document) -> None:
    """Raise when `document` does not validate against the published schema."""
    if jsonschema is not None:
        jsonschema.validate(document, json.loads(PUBLISHED.read_text()))
    else:
        dag_schema.validate_file(document)


def invalid_errors() -> tuple[type[Exception], ...]:
    return (ValidationError,) if jsonschema is None else (jsonschema.ValidationError,)


def test_the_committed_schema_is_the_generated_one():
    out = StringIO()
    call_command("dag_schema", "--output", "-", stdout=out)
    assert PUBLISHED.read_text() == out.getvalue(), (
        "docs/dag-definition.schema.json is stale: run `python manage.py dag_schema`"
    )


def test_the_command_writes_the_schema_to_a_file(tmp_path):
    target = tmp_path / "schema.json"
    call_command("dag_schema", "--output", str(target), stdout=StringIO())
    schema = json.loads(target.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    dag = schema["$defs"]["Dag"]
    assert dag["required"] == ["dag_id"] and dag["additionalProperties"] is False
    assert set(dag["properties"]) == set(dag_schema.Dag.model_fields)
    task = schema["$defs"]["Task"]["properties"]
    assert task["retries"]["minimum"] == 0
    assert schema["$defs"]["TriggerRule"]["enum"][0] == "all_success"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_validates_against_the_published_schema(example):
    validate(json.loads(example.read_text()))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda dag: dag.update(scheduel="orders"), "an unknown key"),
        (lambda dag: dag["tasks"][0].update(retries=-1), "a negative retries"),
        (lambda dag: dag.update(schedule={"every": ["orders"]}), "an unknown condition operator"),
        (lambda dag: dag["tasks"][0].update(trigger_rule="sometimes"), "an unknown trigger rule"),
        (lambda dag: dag.update(dag_id="a/b"), "a dag_id with a slash"),
        (lambda dag: dag["tasks"][0].update(expand={"x": "ab"}), "an expand over a string"),
        (lambda dag: dag["tasks"][0].update(expand={"x": {"xcom": "a", "k": 1}}), "expand key"),
        (lambda dag: dag["tasks"][0].update(expand={}), "an empty expand"),
        (lambda dag: dag["tasks"][0].update(expand={"x": [1], "y": [2]}), "two expand args"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_broken_example_fails_against_the_published_schema(change, why):
    document = json.loads(EXAMPLES[0].read_text())
    dag = copy.deepcopy(document[0] if isinstance(document, list) else document)
    validate(dag)
    change(dag)
    with pytest.raises(invalid_errors()):
        validate(dag)


def test_a_mapped_task_validates_against_the_published_schema():
    validate(
        {
            "dag_id": "fan_out",
            "tasks": [
                {"task_id": "files"},
                {"task_id": "each", "upstream": ["files"], "expand": {"path": {"xcom": "files"}}},
                {"task_id": "fixed", "expand": {"n": [1, "two", {"three": 3}]}},
            ],
        }
    )
