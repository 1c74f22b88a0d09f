"""Issue 26, point 7: inputs that gave 500s on the current main."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assets_app.api.public_auth import create_api_token
from tests.factories import DagFactory, DagRunFactory


@pytest.fixture
def api():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    _, key = create_api_token(username="ops", name="test")
    return Client(headers={"Authorization": f"Bearer {key}"}, raise_request_exception=False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"dag_id_pattern": "sales"}, {"sales_daily", "sales_weekly"}),
        ({"dag_id_pattern": "weekly|ops"}, {"sales_weekly", "ops"}),
        ({"dag_id_prefix_pattern": "sales_w"}, {"sales_weekly"}),
        ({"dag_id_prefix_pattern": "~"}, {"sales_daily", "sales_weekly", "ops"}),
        ({"dag_id_pattern": "nothing"}, set()),
    ],
)
def test_dag_id_patterns_on_dag_runs_filter_instead_of_500(api, params, expected):
    for dag_id in ("sales_daily", "sales_weekly", "ops"):
        DagRunFactory(dag=DagFactory(dag_id=dag_id))
    response = api.get("/api/v2/dags/~/dagRuns", params)
    assert response.status_code == 200, response.content[:500]
    assert {r["dag_id"] for r in response.json()["dag_runs"]} == expected
