"""The trigger form of a Dag with params (issue 45): one field per Param, built from its JSON
Schema as Airflow's trigger form builds it, and the conf the posted fields make.

A field's kind follows the schema's `type` (a `["null", ...]` list makes it nullable) and
`enum`: a select for an enum, a checkbox for a boolean, a number input for an integer or a
number, a text input for a string (`format` `date` / `date-time` / `time` as the browser's
picker), a JSON text area for an array, an object or a schema without one type. It starts from
the Param's default. The posted text is converted to the JSON value the field stands for (an
integer field's "3" is 3); a value that cannot be is an error naming the field, and an empty
field is left out of the conf (the Param's default applies, or Airflow's "No value passed").
Whether the conf then suits the Params is decided by the same check as every other door
(`params.check_conf` in `runs.trigger_dag`): nothing is written on bad input.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .params import ParamSpecs

FIELD_PREFIX = "param."
INPUT_TYPES = {"date": "date", "date-time": "datetime-local", "time": "time"}


@dataclass(frozen=True)
class ParamField:
    """One Param's field: `kind` is select, checkbox, integer, number, text or json; `value`
    the text shown (or the chosen option's), `input_type` the HTML input's type for text."""

    name: str
    kind: str
    value: str
    description: str = ""
    nullable: bool = False
    required: bool = False
    checked: bool = False
    input_type: str = "text"
    choices: tuple[tuple[str, str], ...] = ()
    error: str = ""
    schema: str = ""
    minimum: Any = None
    maximum: Any = None

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


def _types(schema: Mapping[str, Any]) -> tuple[set[str], bool]:
    declared = schema.get("type")
    types = set(declared) if isinstance(declared, list) else {declared} if declared else set()
    return types - {"null"}, "null" in types


def _kind(schema: Mapping[str, Any]) -> str:
    types, _ = _types(schema)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "select"
    if len(types) != 1:
        return "json"
    (only,) = types
    return {
        "boolean": "checkbox",
        "integer": "integer",
        "number": "number",
        "string": "text",
    }.get(only, "json")


def _shown(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "text" and isinstance(value, str):
        return value
    if kind in ("integer", "number") and isinstance(value, int | float):
        return json.dumps(value)
    if kind == "select":
        return json.dumps(value)
    return json.dumps(value, indent=2)


def fields(
    specs: ParamSpecs,
    posted: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
) -> list[ParamField]:
    """The form's fields in the Params' declared order, showing `posted` (a form sent back
    with `errors`) or else each Param's default."""
    shown = []
    for name, spec in specs.items():
        schema = spec.get("schema") or {}
        kind = _kind(schema)
        _, nullable = _types(schema)
        has_default = "default" in spec
        default = spec.get("default")
        if posted is not None:
            value = posted.get(FIELD_PREFIX + name, "")
            checked = kind == "checkbox" and FIELD_PREFIX + name in posted
        else:
            value = _shown(kind, default) if has_default else ""
            checked = default is True
        choices: tuple[tuple[str, str], ...] = ()
        if kind == "select":
            choices = tuple(
                (json.dumps(option), option if isinstance(option, str) else json.dumps(option))
                for option in schema["enum"]
            )
        shown.append(
            ParamField(
                name=name,
                kind=kind,
                value=value,
                description=str(spec.get("description") or schema.get("description") or ""),
                nullable=nullable,
                required=not has_default,
                checked=checked,
                input_type=INPUT_TYPES.get(schema.get("format", ""), "text"),
                choices=choices,
                error=(errors or {}).get(name, ""),
                schema=json.dumps(schema) if schema else "",
                minimum=schema.get("minimum"),
                maximum=schema.get("maximum"),
            )
        )
    return shown


def conf_from_fields(
    specs: ParamSpecs, posted: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The conf the posted fields make, and the fields whose text is not a value of their kind
    (Param name -> why). An empty field is left out; a checkbox is true when sent."""
    conf: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, spec in specs.items():
        kind = _kind(spec.get("schema") or {})
        key = FIELD_PREFIX + name
        if kind == "checkbox":
            conf[name] = key in posted
            continue
        text = posted.get(key, "")
        if kind != "text":
            text = text.strip()
        if text == "":
            continue
        if kind == "text":
            conf[name] = text
        elif kind == "integer":
            try:
                conf[name] = int(text)
            except ValueError:
                errors[name] = f"{text!r} is not an integer"
        else:  # number, select (the option's JSON), json
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                errors[name] = f"not valid JSON: {exc}"
                continue
            if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
                errors[name] = f"{text!r} is not a number"
                continue
            conf[name] = value
    return conf, errors
