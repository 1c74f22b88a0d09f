"""Issue 42's acceptance: every route the pinned Task SDK client (task-sdk 1.3.2,
`airflow/sdk/api/client.py`) calls is served here, read from the client's own code.

The client's calls are found by parsing its source (`self.client.<method>(<path>, ...)`, the
path an f-string, a string, or an `endpoint` variable set in the method or by its
`_resolve_endpoint`), their placeholders filled with a real TI, run and Dag. Each is sent with a
valid task token: an answer that says the service has no such route (JSON 404 "no route ..." or
405 `method_not_allowed`, `api/errors.json_fallback`) fails, unless the route is in `REFUSED`,
the documented few not served yet, which must still answer so (a route served since leaves the
list). Any other answer (200, 204, 404 for a missing row, 409, 422 for the dummy body) means the
route is there.
"""

import ast
import json
from pathlib import Path

import pytest

from tests.factories import AssetFactory, TaskInstanceFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / ".venv-airflow-worker/lib/python3.11/site-packages/airflow/sdk/api/client.py"

# (method, path template) -> why it is not served yet. Issue 42's later steps.
REFUSED = {
    ("PATCH", "task-instances/{id}/rendered-map-index"): "rendered map index (issue 42)",
    ("GET", "task-instances/previous/{dag_id}/{task_id}"): "previous TI reads (issue 42)",
    ("GET", "task-instances/breadcrumbs"): "TI breadcrumbs (issue 42)",
    ("GET", "connection-tests/{connection_test_id}/connection"): "connection tests (issue 42)",
    ("PATCH", "connection-tests/{id}"): "connection tests (issue 42)",
}


def _template(node: ast.expr) -> str | None:
    """The path of a string or f-string node, placeholders as `{name}`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lstrip("/")
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                inner = value.value  # type: ignore[attr-defined]
                if isinstance(inner, ast.Call):  # quote(key, safe="")
                    inner = inner.args[0]
                parts.append("{" + ast.unparse(inner) + "}")
        return "".join(parts).lstrip("/")
    return None


def _endpoints(scope: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "endpoint" for t in node.targets
        ):
            template = _template(node.value)
            if template is not None:
                found.append(template)
    return found


def client_routes() -> set[tuple[str, str]]:
    """(METHOD, path template) of every call the SDK client makes."""
    tree = ast.parse(CLIENT.read_text())
    routes: set[tuple[str, str]] = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        resolver = next(
            (
                f
                for f in cls.body
                if isinstance(f, ast.FunctionDef) and f.name == "_resolve_endpoint"
            ),
            None,
        )
        for method in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            for call in ast.walk(method):
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr in ("get", "post", "put", "patch", "delete", "head")
                    and ast.unparse(call.func.value) == "self.client"
                    and call.args
                ):
                    continue
                verb = call.func.attr.upper()
                template = _template(call.args[0])
                if template is not None:
                    routes.add((verb, template))
                    continue
                local = _endpoints(method)
                if local:
                    routes.update((verb, t) for t in local)
                    continue
                ops = [
                    c.args[0].value
                    for c in ast.walk(method)
                    if isinstance(c, ast.Call)
                    and ast.unparse(c.func) == "self._resolve_endpoint"
                    and isinstance(c.args[0], ast.Constant)
                ]
                assert resolver is not None and ops, f"unresolved call in {method.name}"
                for template in _endpoints(resolver):
                    routes.update((verb, template.replace("{op}", op)) for op in ops)
    return routes


def test_the_parse_finds_the_clients_calls():
    routes = client_routes()
    assert ("PATCH", "task-instances/{id}/run") in routes
    assert ("PUT", "store/asset/by-uri/value") in routes
    assert ("DELETE", "store/asset/by-name/clear") in routes
    assert ("GET", "store/ti/{ti_id}/{key}") in routes
    assert len(routes) >= 40, sorted(routes)
    # Every refusal names a route the client really calls.
    assert set(REFUSED) <= routes, set(REFUSED) - routes


def _no_route(response) -> bool:
    if response.status_code not in (404, 405):
        return False
    try:
        detail = json.loads(response.content)["detail"]
    except (ValueError, KeyError, TypeError):
        return True
    if response.status_code == 405:
        return True
    return isinstance(detail, dict) and str(detail.get("message", "")).startswith("no route")


def test_every_route_the_sdk_client_calls_is_served(worker_api):
    ti = TaskInstanceFactory(running=True, task_id="t")
    asset = AssetFactory()
    values = {
        "id": ti.id,
        "ti_id": ti.id,
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "key": "k",
        "conn_id": "c",
        "offset": "0",
        "connection_test_id": "00000000-0000-0000-0000-000000000001",
    }
    params = {"name": asset.name, "uri": asset.uri, "key": "k", "alias_name": "a"}
    missing, still_refused = [], []
    for verb, template in sorted(client_routes()):
        path = "/" + template.format(**values)
        query = "&".join(f"{k}={v}" for k, v in params.items())
        if verb == "GET":
            answer = worker_api.request(verb, path, ti_id=ti.id, **params)
        elif verb == "HEAD":
            answer = worker_api.request(verb, f"{path}?{query}", ti_id=ti.id)
        else:
            answer = worker_api.request(verb, f"{path}?{query}", {}, ti_id=ti.id)
        gone = _no_route(answer)
        if (verb, template) in REFUSED:
            if not gone:
                still_refused.append((verb, template, answer.status_code))
        elif gone:
            missing.append((verb, template, answer.status_code))
    assert missing == [], "routes the SDK client calls that answer 'no such route'"
    assert still_refused == [], "served now: take them out of REFUSED"
