"""Bad input changes nothing (invariant 10), fuzzed from the OpenAPI schemas with schemathesis.

Every operation of the worker API (`/execution/openapi.json`) and the public API
(`/api/v2/openapi.json`) gets three kinds of cases:
- schemathesis' coverage phase (deterministic): each parameter's boundary values (at and past
  its minimum and maximum, its lengths), wrong types, nulls, missing required parts, unknown
  properties, unexpected methods and content types; every boundary case, and one case per
  other scenario and parameter (`_coverage_plans`);
- the column ranges a schema may not state (`_column_plans`, issue 38: an `offset` beyond bigint
  and an `interval_seconds` beyond int4 were 500s the fuzz did not reach): every integer the
  operation carries (path, query, body) set to 2**31, 2**63 and -2**63-1, every string to one
  character past the longest varchar column, every date-time to the years 1 and 9999, every
  number to +-1e308;
- hypothesis' random positive and negative cases, from a fixed seed (`_random_plans`).

Generation is separate from execution, so the run cannot be flaky by construction: every case is
drawn before the first request, from the schema alone (hypothesis only generates, it never runs
a request, so it never replays or shrinks against a database the run has changed since). The
world's objects (TIs and their tokens, the Dags, an asset, a webhook endpoint, ...) are named by
index in a case's plan and looked up when the case is sent. Issue 38's `FlakyFailure` was
pytest-timeout's alarm firing inside a hypothesis example at load (the public test had the
default 300 s): hypothesis replayed that example, which passed.

The cases are sent in a plain loop, in-process through the WSGI application (the whole Django
stack, middleware included), and every response is checked: no 5xx; every 4xx carries
`{"detail": {"reason": str, ...}}` (a 422 of the public API: Airflow's
`{"detail": [{"type", "loc", "msg"}, ...]}`); after a 4xx, the row counts of every table of the
app, django_q and auth are exactly what they were before the request. Every operation of the
document must have had cases and at least one answer past authentication (neither 401/403 nor a
405 or a route's 404); the statuses each operation saw are printed as figures.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from schemathesis import GenerationMode
from schemathesis.core import NotSet

from assets_app.api import public_auth
from assets_app.api.auth import issue_token
from assets_app.definitions import sync as definitions
from assets_app.events_out import webhooks
from assets_app.models import Asset, AssetAlias, DagImportError, TaskInstance, WebhookEventType
from assets_app.registration import outlets as registration
from assets_app.runtime import variables
from assets_app.scheduling import backfills

from .conftest import app_table_counts, figure, make_running_tis, make_scheduled_dag
from .test_auth_matrix import REFUSED_PAST_THE_CHECKS

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEED = 38
# Random cases per operation and mode, on top of the coverage and column cases: the two fuzz
# runs stay within the time they took with 15 random cases alone (the suite's 15-minute budget).
RANDOM_EXAMPLES = 6
# A loaded CI machine (load ~10 on 2 cores) runs them ~5 times slower than an idle one.
TIMEOUT = 900

INTEGERS_PAST_COLUMNS = (2**31, 2**63, -(2**63) - 1)  # past int4, past bigint, below bigint
LONGEST_VARCHAR = 2000  # Dag.fileloc and DagImportError.filename
STRINGS_PAST_COLUMNS = ("s" * (LONGEST_VARCHAR + 1),)
DATE_TIMES_AT_EDGES = ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z")
NUMBERS_AT_EDGES = (1e308, -1e308)

BOUNDARY_SCENARIOS = frozenset(
    {
        "value_above_maximum",
        "value_below_minimum",
        "maximum_value",
        "minimum_value",
        "near_boundary_number",
        "string_above_max_length",
        "string_below_min_length",
        "maximum_length_string",
        "minimum_length_string",
        "near_boundary_length_string",
        "array_above_max_items",
        "array_below_min_items",
        "maximum_items_array",
        "near_boundary_items_array",
    }
)
# Scenarios whose cases differ only in which optional parts they carry: one case per operation.
ONE_PER_OPERATION = frozenset(
    {
        "unspecified_http_method",
        "malformed_content_type",
        "unsupported_content_type",
        "object_required_and_optional",
        "valid_object",
        "object_unexpected_properties",
    }
)
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


@dataclass(frozen=True)
class Plan:
    """One request to send: a generated case (never mutated: a copy is sent), where it came
    from, and which of the world's bindings names its ids (None: the generated ids as they are).
    `keep` is a path parameter the case is about, never replaced by the binding's."""

    case: Any
    source: str
    binding: int | None
    keep: str | None = None
    real_asset_body: bool = False


# --- generation: from the schema alone, before any request ----------------------------------


def _operations(path: str) -> tuple[Any, list[Any]]:
    schema = schemathesis.openapi.from_wsgi(path, get_wsgi_application())
    return schema, [result.ok() for result in schema.get_all_operations()]


def _label(case: Any) -> str:
    return case.operation.label


def _coverage_cases(schema: Any, operation: Any) -> list[Any]:
    config = schema.config.generation_for(operation=operation, phase="coverage")
    return list(
        schema.iter_coverage_cases(
            operation,
            generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            generation_config=config,
        )
    )


def _coverage_plans(cases: list[Any], bindings: int) -> list[Plan]:
    """Every boundary case; one case per other scenario and parameter (the other variants of
    a wrong type or a missing part cost requests and reach the same validation)."""
    plans: list[Plan] = []
    seen: set[tuple] = set()
    for case in cases:
        data = case._meta.phase.data
        scenario = data.scenario.value
        if scenario in BOUNDARY_SCENARIOS:
            key: tuple = (len(plans),)
        elif scenario in ONE_PER_OPERATION:
            key = (scenario,)
        else:
            key = (scenario, str(data.parameter_location), data.parameter)
        if key in seen:
            continue
        seen.add(key)
        on_path = data.parameter_location == "path"
        plans.append(
            Plan(
                case=case,
                source=f"coverage {scenario}",
                binding=len(plans) % bindings,
                keep=data.parameter if on_path else None,
                real_asset_body=case._meta.generation.mode is GenerationMode.POSITIVE,
            )
        )
    return plans


def _resolve(schema: Any, components: dict, seen: tuple = ()) -> list[tuple[dict, tuple]]:
    """The schema's alternatives ($ref followed, anyOf/oneOf/allOf flattened)."""
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        return _resolve(components[name], components, (*seen, name))
    parts = [(schema, seen)]
    for key in ("anyOf", "oneOf", "allOf"):
        for part in schema.get(key, []):
            parts.extend(_resolve(part, components, seen))
    return parts


def _places(schema: Any, components: dict, path: tuple = (), seen: tuple = ()):
    """(json path, values past the columns) for every integer, string, date-time and number the
    schema holds; a list's items at index 0."""
    for part, part_seen in _resolve(schema, components, seen):
        kind = part.get("type")
        if kind == "integer":
            yield path, INTEGERS_PAST_COLUMNS
        elif kind == "number":
            yield path, NUMBERS_AT_EDGES
        elif kind == "string" and part.get("format") == "date-time":
            yield path, DATE_TIMES_AT_EDGES
        elif kind == "string" and "enum" not in part:
            yield path, STRINGS_PAST_COLUMNS
        for name, sub in part.get("properties", {}).items():
            yield from _places(sub, components, (*path, name), part_seen)
        if "items" in part:
            yield from _places(part["items"], components, (*path, 0), part_seen)


def _set(container: Any, path: tuple, value: Any) -> bool:
    """Set `value` at `path` in `container` (its parent must exist); whether it could."""
    *parents, last = path
    node = container
    for step in parents:
        if isinstance(step, int):
            if not (isinstance(node, list) and node):
                return False
            node = node[0]
        elif isinstance(node, dict) and isinstance(node.get(step), dict | list):
            node = node[step]
        else:
            return False
    if isinstance(last, int):
        if not (isinstance(node, list) and node):
            return False
        node[0] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        return False
    return True


def _column_plans(operation: Any, document: dict, templates: list[Any], bindings: int):
    """Cases with every integer, string, date-time and number of the operation past what its
    column holds, each built on the first positive coverage case that carries the value's
    parent. Returns the plans and the places no template could carry."""
    components = document.get("components", {}).get("schemas", {})
    definition = document["paths"][operation.path][operation.method.lower()]
    places: list[tuple[str, tuple, tuple]] = []
    for parameter in definition.get("parameters", []):
        where = parameter["in"]
        if where in ("path", "query"):
            for path, values in _places(parameter.get("schema", {}), components):
                places.append((where, (parameter["name"], *path), values))
    for content in definition.get("requestBody", {}).get("content", {}).values():
        for path, values in _places(content.get("schema", {}), components):
            if path:  # a whole body that is one string or number: the coverage cases send those
                places.append(("body", path, values))
    plans: list[Plan] = []
    missed: list[str] = []
    for where, path, values in dict.fromkeys(places):
        for value in values:
            for template in templates:
                case = _column_case(template, where, path, value)
                if case is not None:
                    plans.append(
                        Plan(
                            case=case,
                            source=f"column {where}:{'.'.join(map(str, path))}={str(value)[:24]}",
                            binding=len(plans) % bindings,
                            keep=path[0] if where == "path" else None,
                        )
                    )
                    break
            else:
                missed.append(f"{operation.label} {where}:{'.'.join(map(str, path))}")
                break
    return plans, missed


def _column_case(template: Any, where: str, path: tuple, value: Any) -> Any:
    params = dict(template.path_parameters or {})
    query = copy.deepcopy(template.query or {})
    body = template.body if isinstance(template.body, NotSet) else copy.deepcopy(template.body)
    if where == "path":
        if len(path) != 1 or path[0] not in params:
            return None
        params[path[0]] = str(value)
    elif where == "query":
        name = path[0]
        text = json.dumps(value) if isinstance(value, float) else str(value)
        query[name] = [text] if len(path) > 1 else text
    elif not isinstance(body, dict) or not _set(body, path, value):
        return None
    return template.operation.Case(
        method=template.method,
        path_parameters=params,
        headers=dict(template.headers or {}),
        query=query,
        body=body,
        media_type=template.media_type,
    )


def _draw(strategy: Any, count: int) -> list[Any]:
    """`count` values of `strategy` from a fixed seed: generation only, nothing runs."""
    drawn: list[Any] = []

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=count,
        derandomize=False,  # the seed decides
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return drawn


def _has_inputs(operation: Any) -> bool:
    return bool(
        len(operation.path_parameters)
        or len(operation.query)
        or len(operation.headers)
        or len(operation.body)
    )


def _random_plans(operation: Any, bindings: int) -> list[Plan]:
    """hypothesis' positive and negative cases; six in seven name the world's objects."""
    choose = random.Random(f"{SEED} {operation.label}")
    plans: list[Plan] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        if mode is GenerationMode.NEGATIVE and not _has_inputs(operation):
            continue  # nothing to violate (`GET /api/v2/version`)
        for case in _draw(operation.as_strategy(generation_mode=mode), RANDOM_EXAMPLES):
            binding = choose.choice([None, *range(bindings)])
            plans.append(
                Plan(
                    case=case,
                    source=f"random {mode.value}",
                    binding=binding,
                    real_asset_body=mode is GenerationMode.POSITIVE,
                )
            )
    return plans


def plan_cases(path: str, bindings: int) -> tuple[list[str], list[Plan], list[str]]:
    """Every case of the document's operations (labels, plans, places no case could carry)."""
    schema, operations = _operations(path)
    document = schema.raw_schema
    labels = [
        f"{method.upper()} {route}"
        for route, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    ]
    plans: list[Plan] = []
    missed: list[str] = []
    # Deletes last: the world's objects (its endpoint, Variable, ...) are there for the others.
    for operation in sorted(operations, key=lambda op: op.method.upper() == "DELETE"):
        coverage = _coverage_cases(schema, operation)
        plans.extend(_coverage_plans(coverage, bindings))
        templates = [
            case
            for case in coverage
            if case._meta.generation.mode is GenerationMode.POSITIVE
            and case.method == operation.method.upper()
        ]
        column, unplaced = _column_plans(operation, document, templates, bindings)
        plans.extend(column)
        missed.extend(unplaced)
        plans.extend(_random_plans(operation, bindings))
    return labels, plans, missed


# --- the world and execution ----------------------------------------------------------------


BINDINGS = 7  # the world's bindings: one per TI of the producer's run, and the consumer Dag's


@pytest.fixture
def world(settings, tmp_path):
    """A small world for the cases to hit: scheduled Dags, queued/running/done TIs, events, an
    alias, a time-scheduled Dag with a backfill, a webhook endpoint, an import error, a
    Variable and a Connection. `bindings` name them coherently (a TI with its Dag, run, task
    and map index), the same singletons in each."""
    # A run wait streams while its run is unfinished, and a response the fuzz drops holds its
    # slot until it is collected: short waits, enough slots, in a folder of this test's own.
    settings.RUN_WAIT_MAX_SECONDS = 0.05
    settings.RUN_WAIT_MAX_CONCURRENT = 1000
    settings.RUN_WAIT_SLOT_DIR = tmp_path / "wait-slots"
    dag = make_scheduled_dag(
        "fuzz_dag", {"all": ["fuzz-a", {"any": ["fuzz-b", {"alias": "fuzz-alias"}]}]}
    )
    running = make_running_tis("fuzz_producer", 6)
    TaskInstance.objects.filter(id__in=[ti.id for ti in running[:2]]).update(state="queued")
    TaskInstance.objects.filter(id=running[2].id).update(state="success")
    asset = Asset.objects.get(name="fuzz-a")
    registration.register_external_event(asset=asset, extra={"seed": True})
    definitions.sync_definitions(
        dags=definitions.parse_document(
            {
                "dag_id": "fuzz_timed",
                "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
                "timetable": "@daily",
                "start_date": "2026-01-01",
                "tasks": [{"task_id": "a"}],
            },
            file="fuzz_timed.json",
        )
    )
    backfill = backfills.create_backfill(
        dag_id="fuzz_timed",
        from_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        to_date=dt.datetime(2026, 1, 3, tzinfo=dt.UTC),
    )
    endpoint = webhooks.create_endpoint(
        url="https://93.184.216.34/fuzz",
        subscriptions=[webhooks.SubscriptionSpec(WebhookEventType.values[0], "*")],
    ).endpoint
    import_error = DagImportError.objects.create(
        filename="fuzz/broken.py", timestamp=timezone.now(), stack_trace="SyntaxError"
    )
    variables.set_variable(key="fuzz_var", value="v")
    variables.save_connection(conn_id="fuzz_conn", create=True, conn_type="http", host="h")
    user = get_user_model().objects.create_user(
        "fuzzer", password="x", is_staff=True, is_superuser=True
    )
    _, key = public_auth.create_api_token(username=user.username, name="fuzz")
    run_id = running[0].run_id
    common = {
        "asset_id": str(asset.pk),
        "asset_alias_id": str(AssetAlias.objects.get(name="fuzz-alias").pk),
        "backfill_id": str(backfill.pk),
        "endpoint_id": str(endpoint.pk),
        "import_error_id": str(import_error.pk),
        "variable_key": "fuzz_var",
        "connection_id": "fuzz_conn",
        "key": "fuzz_key",
        "run_id": run_id,
        "dag_run_id": run_id,
        "try_number": "1",
    }
    bindings = [
        {
            **common,
            "task_instance_id": str(ti.id),
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "map_index": str(ti.map_index),
        }
        for ti in running
    ] + [{**common, "task_instance_id": str(running[3].id), "dag_id": dag.dag_id}]
    assert len(bindings) == BINDINGS
    return {
        "ti_ids": [ti.id for ti in running],
        "bindings": bindings,
        "api_key": key,
    }


def _check(response: Any, before: dict[str, int], after: dict[str, int], label: str) -> None:
    """The invariant-10 checks for one response."""
    status = response.status_code
    assert status < 500, f"{label}: {status} {response.text[:500]}"
    if 400 <= status < 500:
        body = json.loads(response.text)
        detail = body.get("detail")
        if status == 422 and isinstance(detail, list):  # public API: Airflow's HTTPValidationError
            assert detail, f"{label}: {response.text[:300]}"
            for item in detail:
                assert isinstance(item.get("loc"), list), f"{label}: {response.text[:300]}"
                assert isinstance(item.get("msg"), str) and isinstance(item.get("type"), str)
        else:
            assert isinstance(detail, dict), f"{label}: {status} {response.text[:300]}"
            assert isinstance(detail.get("reason"), str), f"{label}: {response.text[:300]}"
        changed = {t: (before[t], after[t]) for t in before if before[t] != after[t]}
        assert not changed, f"{label}: {status} changed row counts {changed}"


def _past_authentication(case: Any, response: Any) -> bool:
    """An answer the operation's own code gave: not 401/403 (but a route's own 403 for a
    feature Airflow's default configuration turns off), not a 405 or a route's 404."""
    if case.method != case.operation.method.upper() or response.status_code in (401, 405):
        return False
    if response.status_code == 403:
        try:
            detail = json.loads(response.text).get("detail")
        except ValueError:
            return False
        return isinstance(detail, dict) and detail.get("reason") in REFUSED_PAST_THE_CHECKS
    if response.status_code == 404:
        try:
            detail = json.loads(response.text).get("detail")
        except ValueError:
            return False
        return not (isinstance(detail, dict) and detail.get("message", "").startswith("no route "))
    return True


def _send(plan: Plan, world: dict, headers_for: Any) -> tuple[Any, Any]:
    case = plan.case
    params = dict(case.path_parameters or {})
    body = case.body if isinstance(case.body, NotSet) else copy.deepcopy(case.body)
    binding = None
    if plan.binding is not None:
        binding = world["bindings"][plan.binding % len(world["bindings"])]
        for name in params:
            if name in binding and name != plan.keep:
                params[name] = binding[name]
        named = isinstance(body, dict) and {"name", "uri", "asset_id"} & set(body)
        if plan.real_asset_body and named and case.path.endswith("/assets/events"):
            # POST /assets/events: name a real asset so schema-valid cases register events.
            body.pop("asset_id", None)
            body.update(name="fuzz-a", uri="fuzz-a")
    sent = case.operation.Case(
        method=case.method,
        path_parameters=params,
        headers=dict(case.headers or {}),
        cookies=dict(case.cookies or {}),
        query=copy.deepcopy(case.query),
        body=body,
        media_type=case.media_type,
        multipart_content_types=case.multipart_content_types,
        _meta=case._meta,
    )
    return sent, sent.call(headers=headers_for(case.operation, params, binding))


def _shown(body: Any) -> str:
    return "(no body)" if isinstance(body, NotSet) else repr(body)


def _digest(plans: list[Plan]) -> str:
    """A fingerprint of the requests planned: the same on every run and machine (the figures
    of two runs show it)."""
    text = "\n".join(
        repr((p.source, p.binding, p.keep, p.case.method, p.case.path_parameters, p.case.query))
        + _shown(p.case.body)
        for p in plans
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _fuzz(path: str, name: str, world: dict, headers_for: Any) -> None:
    started = time.monotonic()
    labels, plans, missed = plan_cases(path, BINDINGS)
    generated = time.monotonic() - started
    assert not missed, f"no case could carry {missed}"
    statuses: dict[str, Counter] = {label: Counter() for label in labels}
    reached: set[str] = set()
    failures: list[str] = []
    before = app_table_counts()
    for plan in plans:
        label = _label(plan.case)
        case, response = _send(plan, world, headers_for)
        after = app_table_counts()
        described = (
            f"{label} ({plan.source}): {case.method} {case.formatted_path} "
            f"query={case.query!r:.300} body={_shown(case.body):.300}"
        )
        try:
            _check(response, before, after, described)
        except AssertionError as exc:
            failures.append(str(exc))
        before = after
        statuses.setdefault(label, Counter())[str(response.status_code)] += 1
        if _past_authentication(case, response):
            reached.add(label)
    elapsed = time.monotonic() - started
    figure(
        f"fuzz {name}: {len(plans)} cases over {len(labels)} operations, plan {_digest(plans)} "
        f"(generated in {generated:.1f} s, all in {elapsed:.1f} s)"
    )
    for label, seen in sorted(statuses.items()):
        figure(f"  {label}: {dict(sorted(seen.items()))}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert set(statuses) == set(labels), set(statuses) ^ set(labels)
    assert all(statuses[label] for label in labels), [x for x in labels if not statuses[x]]
    assert reached == set(labels), f"never past authentication: {sorted(set(labels) - reached)}"
    # Somewhere the cases must get past validation, or the fuzz proves little.
    assert any(s in {"200", "201", "204"} for seen in statuses.values() for s in seen)


# Its run-time endpoints (XComs, Variables, dag runs, ...) tripled the operations.
@pytest.mark.timeout(TIMEOUT)
def test_fuzz_worker_api(world):
    from django.conf import settings as django_settings

    def headers_for(operation, params, binding):
        if operation.path.endswith("/dags/sync"):
            return {"Authorization": f"Bearer {django_settings.DAG_SYNC_KEY}"}
        if operation.path.endswith("/workloads/claim"):
            return {"Authorization": f"Bearer {django_settings.WORKER_API_KEY}"}
        raw = params.get("task_instance_id")
        try:
            ti_id = uuid.UUID(str(raw))
        except ValueError:
            ti_id = uuid.UUID(binding["task_instance_id"]) if binding else world["ti_ids"][0]
        return {"Authorization": f"Bearer {issue_token(ti_id, try_number=1)}"}

    _fuzz("/execution/openapi.json", "worker API", world, headers_for)


@pytest.mark.timeout(TIMEOUT)
def test_fuzz_public_api(world):
    def headers_for(operation, params, binding):
        return {"Authorization": f"Bearer {world['api_key']}"}

    _fuzz("/api/v2/openapi.json", "public API", world, headers_for)
