"""Dag params (Airflow's `DAG(params=...)`, issue 39): each Param's default, description and
JSON Schema, kept with the Dag, and the check every manual run's conf passes, as Airflow 3.3.2
makes it.

Airflow's check is `SerializedParamsDict.deep_merge(conf).validate()` in `create_dagrun`, with
`jsonschema.validate` and a `FormatChecker`:

- a conf key that names a Param replaces its value; one that names none is kept and checked
  against nothing; every Param is then validated in its declared order, the first failing one
  refusing the run: `Invalid input for param a: No value passed` (no default and no conf value),
  or `Invalid input for param b: 2 is less than the minimum of 3` and jsonschema's detail;
- the conf is stored as given (Airflow does not store the defaults into it); the stock Task
  SDK resolves `params` from the DAG file and the run's conf, as on Airflow.
- a Dag that has a schedule (time, assets or `@once`) whose defaults do not validate is refused
  when synced, with Airflow's words (its `DAG._validate_params`).

The params are stored as JSON text, not JSONB: jsonschema's message prints the schema as
given, and JSONB would reorder its keys (and the Params' order decides which error is told).
"""

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import FormatChecker, validate

from ..guards import exceptions

# A Param without a default has no "default" key (Airflow's NOTSET).
ParamSpecs = dict[str, dict[str, Any]]


class _NotSet:
    def __repr__(self) -> str:
        return "NOTSET"


_NOT_SET = _NotSet()


class ParamError(ValueError):
    """Airflow's ParamValidationError: the text is Airflow's message."""


def dump(specs: ParamSpecs) -> str:
    """The stored text of a Dag's params ("" for none), in their declared order."""
    return json.dumps(specs, separators=(",", ":")) if specs else ""


def load(text: str) -> ParamSpecs:
    """A Dag's stored params, in their declared order."""
    return json.loads(text) if text else {}


def _resolve(spec: Mapping[str, Any], value: Any) -> Any:
    validate(value, spec.get("schema") or {}, format_checker=FormatChecker())
    return value


def resolved(specs: ParamSpecs, conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every Param's value with `conf` merged in, validated in order (Airflow's
    `deep_merge(conf).validate()`). Raises ParamError naming the first Param that fails."""
    merged: dict[str, tuple[dict[str, Any], Any]] = {}
    for name, spec in specs.items():
        merged[name] = (spec, spec.get("default", _NOT_SET))
    for name, value in (conf or {}).items():
        spec = merged[name][0] if name in merged else {}
        merged[name] = (spec, value)
    values = {}
    for name, (spec, value) in merged.items():
        try:
            if value is _NOT_SET:
                raise ValueError("No value passed")
            values[name] = _resolve(spec, value)
        except Exception as exc:  # Airflow turns any failure of one Param into its message
            raise ParamError(f"Invalid input for param {name}: {exc}") from None
    return values


def check_conf(specs: ParamSpecs, conf: Mapping[str, Any] | None) -> None:
    """A run's conf against the Dag's params: BadRequest (400, "value_error", Airflow's
    message) when a Param refuses it. Nothing is written either way."""
    if not specs:
        return
    try:
        resolved(specs, conf)
    except ParamError as exc:
        raise exceptions.BadRequest(str(exc), reason="value_error") from None


def schedule_error(dag_id: str, specs: ParamSpecs) -> str | None:
    """Airflow's refusal of a scheduled Dag whose params do not validate without a conf (None:
    they do)."""
    try:
        resolved(specs)
    except ParamError:
        return (
            f"Dag {dag_id!r} is not allowed to define a Schedule, as there are required params "
            "without default values, or the default values are not valid."
        )
    return None


def defaults(specs: ParamSpecs) -> dict[str, Any]:
    """The Params that have a default, with it (what Airflow's trigger form starts from)."""
    return {name: spec["default"] for name, spec in specs.items() if "default" in spec}


def api_view(specs: ParamSpecs) -> dict[str, dict[str, Any]]:
    """The public API's `params` of a Dag (Airflow's `DAGDetailsResponse.params`: each Param's
    `value`, null when it has none or it does not validate, `schema`, `description`, `source`)."""
    view = {}
    for name, spec in specs.items():
        try:
            value = _resolve(spec, spec["default"]) if "default" in spec else None
        except Exception:
            value = None
        view[name] = {
            "value": value,
            "schema": spec.get("schema") or {},
            "description": spec.get("description"),
            "source": spec.get("source"),
        }
    return view
