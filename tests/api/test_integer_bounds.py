"""Issue 38: every integer a request carries is bounded at its column's range, so an integer
beyond it is a 422 (or matches nothing), never a 500 from the database ("bigint out of range",
"integer out of range": schemathesis found 7 such 500s on the webhook lists and freshness).

The rule, over both OpenAPI documents: every integer query parameter and request-body field has
a minimum and a maximum, except the names in `LOOKED_UP_ONLY`: those are only ever compared in a
filter, where Django 5's out-of-range lookups match nothing; the second test proves that for each
of them with a value beyond bigint. Path parameters are ids looked up the same way (the third
test sends one beyond bigint to a route of each kind)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api import execution_api, public_api
from assets_app.api.public_auth import create_api_token

BIG = 2**63

# (document, method, path, where): compared in lookups only, never stored or used as an offset.
LOOKED_UP_ONLY = {
    ("public_api", "GET", "/assets/events", "query:asset_id"),
    ("public_api", "GET", "/assets/events", "query:source_map_index"),
    ("public_api", "GET", "/dags/{dag_id}/dagRuns", "query:dag_version[]"),
    *(
        ("public_api", "GET", path, f"query:{name}[]")
        for path in (
            "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances",
            "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/listMapped",
        )
        for name in ("map_index", "try_number", "version_number")
    ),
    (
        "public_api",
        "GET",
        "/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/logs/{try_number}",
        "query:map_index",
    ),
    # A Dag version's number, compared in a lookup (issue 49).
    ("public_api", "GET", "/dags/{dag_id}/dagVersions", "query:version_number"),
    # The event log's map index and try, compared with the audit entry's detail (issue 49).
    ("public_api", "GET", "/eventLogs", "query:map_index"),
    ("public_api", "GET", "/eventLogs", "query:try_number"),
    # An external event's asset, looked up (404 when there is none).
    ("public_api", "POST", "/assets/events", "body.asset_id"),
}


def _integers(schema, components, where, seen=()):
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            yield from _integers(components[name], components, where, (*seen, name))
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for part in schema.get(key, []):
            yield from _integers(part, components, where, seen)
    if schema.get("type") == "integer":
        yield where, schema
    for name, part in schema.get("properties", {}).items():
        yield from _integers(part, components, f"{where}.{name}", seen)
    if "items" in schema:
        yield from _integers(schema["items"], components, f"{where}[]", seen)


def unbounded_integers():
    found = set()
    for api in (public_api, execution_api):
        document = api.get_openapi_schema(path_prefix="")
        components = document.get("components", {}).get("schemas", {})
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                places = [
                    (parameter.get("schema", {}), f"query:{parameter['name']}")
                    for parameter in operation.get("parameters", [])
                    if parameter["in"] == "query"
                ] + [
                    (content.get("schema", {}), "body")
                    for content in operation.get("requestBody", {}).get("content", {}).values()
                ]
                for schema, where in places:
                    for place, integer in _integers(schema, components, where):
                        low = "minimum" in integer or "exclusiveMinimum" in integer
                        high = "maximum" in integer or "exclusiveMaximum" in integer
                        if not (low and high):
                            found.add((api.urls_namespace, method.upper(), path, place))
    return found


def test_every_integer_a_request_carries_is_bounded_or_only_looked_up():
    assert unbounded_integers() - LOOKED_UP_ONLY == set()
    # The exceptions are still there (an entry that no longer applies is removed from the list).
    assert unbounded_integers() >= LOOKED_UP_ONLY


@pytest.fixture
def api(db):
    get_user_model().objects.create_superuser("ops", password="pw")
    _, key = create_api_token(username="ops", name="t")
    return Client(headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize(
    "url",
    [
        f"/api/v2/assets/events?asset_id={BIG}",
        f"/api/v2/assets/events?source_map_index={BIG}",
        f"/api/v2/dags/~/dagRuns?dag_version={BIG}",
        f"/api/v2/dags/~/dagRuns/~/taskInstances?map_index={BIG}",
        f"/api/v2/dags/~/dagRuns/~/taskInstances?try_number={BIG}",
        f"/api/v2/dags/~/dagRuns/~/taskInstances?version_number={BIG}",
        f"/api/v2/dags/d/dagRuns/r/taskInstances/t/listMapped?map_index={BIG}",
        f"/api/v2/dags/d/dagRuns/r/taskInstances/t/logs/1?map_index={BIG}",
        # Path ids beyond bigint: 404, as any unknown id.
        f"/api/v2/assets/{BIG}",
        f"/api/v2/assets/aliases/{BIG}",
        f"/api/v2/backfills/{BIG}",
        f"/api/v2/importErrors/{BIG}",
        f"/api/v2/webhooks/endpoints/{BIG}",
        f"/api/v2/webhooks/endpoints/{BIG}/deliveries",
        f"/api/v2/assets/{BIG}/freshness",
        f"/api/v2/dags/d/dagRuns/r/taskInstances/t/{BIG}",
        f"/api/v2/dags/d/dagRuns/r/taskInstances/t/logs/{BIG}",
    ],
)
def test_an_integer_beyond_bigint_in_a_lookup_is_no_500(api, url):
    assert api.get(url).status_code in (200, 404, 422)


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("get", f"/api/v2/webhooks/endpoints?offset={BIG}", None),
        ("get", "/api/v2/webhooks/endpoints?offset=2147483648", None),
        ("post", "/api/v2/assets/events", {"asset_id": BIG}),
    ],
)
def test_what_schemathesis_found_answers_4xx(api, method, url, body):
    import json

    if body is None:
        response = api.get(url)
    else:
        response = api.post(url, data=json.dumps(body), content_type="application/json")
    assert 400 <= response.status_code < 500, response.content


def test_a_freshness_interval_beyond_the_column_is_a_422(api):
    from tests.factories import AssetFactory

    asset = AssetFactory()
    response = api.put(
        f"/api/v2/assets/{asset.pk}/freshness",
        data={"kind": "max_interval", "interval_seconds": 2**31},
        content_type="application/json",
    )
    assert response.status_code == 422, response.content
