"""Our `/api/v2/openapi.json` against Airflow 3.3.2's own public API document
(`v2-rest-api-generated.yaml` from the apache-airflow-core wheel, `airflow_env.airflow_openapi`).

For every operation we serve: Airflow has the same path and method; every query and path
parameter Airflow declares is declared here too (an undeclared one would be silently ignored),
with a compatible type; every field of Airflow's request body is accepted and nothing Airflow
leaves optional is required; and every response Airflow documents with a JSON body is documented
here with a compatible schema, recursively: every property Airflow lists is present, required
where Airflow requires it, nullable exactly where Airflow's is, of a compatible type.
"""

from typing import Any

import pytest
from django.test import Client

from .airflow_env import airflow_openapi

pytestmark = pytest.mark.django_db


def _resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = doc["components"]["schemas"][name]
    return schema


def _alternatives(doc: dict, schema: dict) -> tuple[list[dict], bool]:
    """(non-null alternatives, nullable) of a schema."""
    schema = _resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options is None:
        if schema.get("type") == "null":
            return [], True
        return [schema], bool(schema.get("nullable"))
    alts, nullable = [], False
    for option in options:
        inner, inner_null = _alternatives(doc, option)
        alts += inner
        nullable |= inner_null
    return alts, nullable


def _kind(schema: dict) -> str:
    if "type" in schema:
        return schema["type"]
    if "properties" in schema:
        return "object"
    return "any"


COMPATIBLE = {
    ("number", "integer"),
    ("object", "object"),
}


def _compare(
    theirs_doc: dict, theirs: dict, ours_doc: dict, ours: dict, where: str, *, nulls: bool = True
) -> list[str]:
    """Problems found where our schema does not answer what Airflow's client expects (`nulls`
    False: nullability not compared, as for query parameters, which a client simply omits)."""
    t_alts, t_null = _alternatives(theirs_doc, theirs)
    o_alts, o_null = _alternatives(ours_doc, ours)
    problems = []
    if nulls and t_null != o_null:
        problems.append(f"{where}: nullable {o_null}, Airflow {t_null}")
    for t in t_alts:
        if _kind(t) == "any":
            continue
        candidates = [
            o for o in o_alts if _kind(o) == _kind(t) or (_kind(t), _kind(o)) in COMPATIBLE
        ]
        if not candidates:
            kinds = [_kind(o) for o in o_alts]
            problems.append(f"{where}: type {kinds}, Airflow {_kind(t)}")
            continue
        best = min((_compare_one(theirs_doc, t, ours_doc, o, where) for o in candidates), key=len)
        problems += best
    return problems


def _compare_one(theirs_doc: dict, t: dict, ours_doc: dict, o: dict, where: str) -> list[str]:
    problems: list[str] = []
    if _kind(t) == "array":
        return _compare(theirs_doc, t.get("items", {}), ours_doc, o.get("items", {}), f"{where}[]")
    if _kind(t) != "object" or "properties" not in t:
        return problems
    if "properties" not in o:
        return [f"{where}: a free-form object, Airflow lists properties"]
    t_required, o_required = set(t.get("required", ())), set(o.get("required", ()))
    for name, prop in t["properties"].items():
        if name not in o["properties"]:
            problems.append(f"{where}.{name}: missing")
            continue
        if name in t_required and name not in o_required:
            problems.append(f"{where}.{name}: optional, Airflow requires it")
        problems += _compare(theirs_doc, prop, ours_doc, o["properties"][name], f"{where}.{name}")
    return problems


def _json_schema(response: dict) -> dict | None:
    return response.get("content", {}).get("application/json", {}).get("schema")


def _operations(doc: dict) -> dict[tuple[str, str], dict]:
    return {
        (method, path): op
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    }


# Responses Airflow's document lists that its route never sends, with what it sends instead.
DOCUMENTED_NOT_SENT = {
    # `delete_dag` returns `Response(status_code=204)` (routes/public/dags.py); FastAPI documents
    # the decorator's default 200 with an empty schema. We answer 204, as the route does.
    ("delete", "/api/v2/dags/{dag_id}", "200"): 204,
}


@pytest.fixture(scope="module")
def documents() -> tuple[dict, dict]:
    return airflow_openapi(), Client().get("/api/v2/openapi.json").json()


def test_every_operation_matches_airflows_document(documents):
    theirs_doc, ours_doc = documents
    theirs, ours = _operations(theirs_doc), _operations(ours_doc)
    assert len(ours) >= 31
    problems: list[str] = []
    for key, op in sorted(ours.items()):
        label = f"{key[0].upper()} {key[1]}"
        if key not in theirs:
            # Our own extensions, tagged as such: issue 29's events out (webhooks, freshness).
            if "events-out" in op.get("tags", []):
                continue
            problems.append(f"{label}: not in Airflow's document")
            continue
        airflow = theirs[key]
        ours_params = {(p["in"], p["name"]): p for p in op.get("parameters", [])}
        for param in airflow.get("parameters", []):
            ident = (param["in"], param["name"])
            if ident not in ours_params:
                problems.append(f"{label}: {param['in']} parameter {param['name']} not declared")
                continue
            problems += _compare(
                theirs_doc,
                param["schema"],
                ours_doc,
                ours_params[ident]["schema"],
                f"{label} ?{param['name']}",
                nulls=False,
            )
        if "requestBody" in airflow:
            problems += _compare_body(theirs_doc, airflow, ours_doc, op, label)
        for status, response in airflow["responses"].items():
            schema = _json_schema(response)
            if schema is None:
                continue
            if status == "422" and schema.get("$ref", "").endswith("/HTTPExceptionResponse"):
                # Airflow documents a few 422s as HTTPExceptionResponse; every 422 of ours is an
                # HTTPValidationError (which the client still raises as a 422).
                continue
            if (*key, status) in DOCUMENTED_NOT_SENT:
                if str(DOCUMENTED_NOT_SENT[(*key, status)]) not in op["responses"]:
                    problems.append(f"{label}: response {DOCUMENTED_NOT_SENT[(*key, status)]}")
                continue
            if status not in op["responses"]:
                problems.append(f"{label}: response {status} not documented")
                continue
            ours_schema = _json_schema(op["responses"][status])
            if ours_schema is None:
                if status == "200" and key[1].endswith("/wait"):
                    continue  # NDJSON in both documents
                problems.append(f"{label}: response {status} has no JSON schema")
                continue
            problems += _compare(theirs_doc, schema, ours_doc, ours_schema, f"{label} {status}")
    assert not problems, "\n".join(problems)


def _compare_body(theirs_doc: dict, airflow: dict, ours_doc: dict, op: dict, label: str):
    if "requestBody" not in op:
        return [f"{label}: request body not accepted"]
    t_alts, _ = _alternatives(theirs_doc, _json_schema(airflow["requestBody"]))
    o_alts, _ = _alternatives(ours_doc, _json_schema(op["requestBody"]))
    problems = []
    for t in t_alts:
        o: dict[str, Any] = o_alts[0] if o_alts else {}
        for name, prop in t.get("properties", {}).items():
            if name not in o.get("properties", {}):
                problems.append(f"{label} body.{name}: not accepted")
                continue
            _, t_null = _alternatives(theirs_doc, prop)
            _, o_null = _alternatives(ours_doc, o["properties"][name])
            if t_null and not o_null:
                problems.append(f"{label} body.{name}: null refused, Airflow accepts it")
        for name in set(o.get("required", ())) - set(t.get("required", ())):
            problems.append(f"{label} body.{name}: required here, optional in Airflow")
    return problems


def test_the_comparison_finds_a_missing_field_a_type_and_a_nullability(documents):
    """The checks above can fail: a copy of our document with one field dropped, one retyped and
    one made non-nullable gets exactly those three problems."""
    theirs_doc, ours_doc = documents
    import copy

    broken = copy.deepcopy(ours_doc)
    props = broken["components"]["schemas"]["DAGRunResponse"]["properties"]
    del props["dag_display_name"]
    props["run_after"] = {"type": "integer"}
    props["note"] = {"type": "string"}
    problems = _compare(
        theirs_doc,
        {"$ref": "#/components/schemas/DAGRunResponse"},
        broken,
        {"$ref": "#/components/schemas/DAGRunResponse"},
        "DAGRunResponse",
    )
    assert sorted(problems) == [
        "DAGRunResponse.dag_display_name: missing",
        "DAGRunResponse.note: nullable False, Airflow True",
        "DAGRunResponse.run_after: type ['integer'], Airflow string",
    ]
