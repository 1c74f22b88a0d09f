"""Issue 45: the Dag page shows its file's code as the worker synced it (escaped, numbered,
read only), pauses and unpauses the Dag with a button, audited as the list's and the API's (its
own form's pause too), and triggers a run through a form built from the Dag's params, checked
by the server (a 400 with the reason and nothing written on bad input)."""

import json

from django.db import transaction
from django.urls import reverse

from assets_app.admin import dags as dags_admin
from assets_app.catalog import task_order
from assets_app.definitions import sources
from assets_app.models import AuditEntry, Dag, DagRun, Task, TaskUpstream
from assets_app.models.dags import DAG_SOURCE_MAX_BYTES
from tests.factories import DagFactory, DagRunFactory

from .test_dag_list import csrf_client, token_of


def _store(fileloc: str, text: str) -> None:
    with transaction.atomic():
        sources.record_sources([sources.cut(fileloc, text)])


def test_the_code_view_shows_the_synced_file_escaped_with_line_numbers(staff_client):
    dag = DagFactory(dag_id="etl", fileloc="dags/etl.py")
    _store("dags/etl.py", 'print("<script>alert(1)</script>")\n\nx = 1 & 2\n')
    page = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content
    text = page.decode()
    code = text[text.index('id="dag-code"') :]
    code = code[: code.index("</pre>")]
    assert "<script>alert" not in code
    assert (
        '<span class="aes-source-line">print(&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;)\n'
        "</span>" in code
    )
    assert code.count('class="aes-source-line"') == 3  # numbered by CSS counters, one a line
    assert "dags/etl.py · 3 lines · 46 bytes" in code
    assert ".aes-source-line::before { counter-increment: aes-line;" in text


def test_the_code_view_says_when_there_is_no_source_or_it_was_cut(staff_client):
    dag = DagFactory(dag_id="etl", fileloc="dags/etl.py")
    url = reverse("admin:assets_app_dag_change", args=[dag.pk])
    assert "No source stored for dags/etl.py" in staff_client.get(url).content.decode()
    _store("dags/etl.py", "x = 1\n" * (DAG_SOURCE_MAX_BYTES // 6 + 1))
    text = staff_client.get(url).content.decode()
    assert "truncated: the file is 524,292 bytes; only its first 524,288 bytes are stored" in text


def test_the_pages_toggle_pauses_and_unpauses_audited(django_user_model):
    DagFactory(dag_id="etl", is_paused=False)
    client = csrf_client(django_user_model, "change_dag")
    url = reverse("admin:assets_app_dag_change", args=["etl"])
    page = client.get(url).content.decode()
    pause = reverse("admin:assets_app_dag_pause", args=["etl"])
    form = page[page.index('id="dag-pause-form"') - 200 : page.index('id="dag-pause-toggle"')]
    assert f'action="{pause}"' in form and 'name="is_paused" value="1"' in form
    answer = client.post(
        pause, {"is_paused": "1", "csrfmiddlewaretoken": token_of(page)}, HTTP_REFERER=url
    )
    assert answer.status_code == 302 and answer.url == url  # back to the Dag page
    page = client.get(url).content.decode()
    assert Dag.objects.get().is_paused and ">Unpause</button>" in page
    client.post(pause, {"is_paused": "0", "csrfmiddlewaretoken": token_of(page)})
    assert not Dag.objects.get().is_paused
    assert list(AuditEntry.objects.order_by("id").values_list("action", "actor_name", "via")) == [
        ("dag.pause", "lister", "admin"),
        ("dag.unpause", "lister", "admin"),
    ]


def test_a_viewer_has_no_toggle(django_user_model):
    DagFactory(dag_id="etl")
    page = csrf_client(django_user_model).get(reverse("admin:assets_app_dag_change", args=["etl"]))
    assert page.status_code == 200 and 'id="dag-pause-toggle"' not in page.content.decode()


def test_a_pause_through_the_pages_own_form_is_audited(staff_client):
    DagFactory(dag_id="etl", is_paused=False)
    url = reverse("admin:assets_app_dag_change", args=["etl"])
    form = {"max_active_runs": "16", "tasks-TOTAL_FORMS": "0", "tasks-INITIAL_FORMS": "0"}
    staff_client.post(url, {**form, "max_active_runs": "8"})  # the pause unchanged: no entry
    assert not AuditEntry.objects.filter(action__startswith="dag.").exists()
    response = staff_client.post(url, {**form, "is_paused": "on"})
    assert response.status_code == 302
    assert Dag.objects.get().is_paused
    response = staff_client.post(url, form)
    assert not Dag.objects.get().is_paused
    entries = AuditEntry.objects.filter(action__startswith="dag.").order_by("id")
    assert list(entries.values_list("action", "actor_name", "via", "summary")) == [
        ("dag.pause", "operator", "admin", "dag.pause etl"),
        ("dag.unpause", "operator", "admin", "dag.unpause etl"),
    ]


PARAMS = {
    "count": {"default": 5, "schema": {"type": "integer", "minimum": 1}},
    "mode": {"default": "full", "schema": {"type": "string", "enum": ["full", "delta"]}},
    "dry": {"default": False, "schema": {"type": "boolean"}},
    "tables": {"default": ["a"], "schema": {"type": "array"}},
    "day": {"schema": {"type": "string", "format": "date"}, "description": "Which day"},
}


def _fields(**values):
    posted = {"param_fields": "1", "conf": "{}"}
    posted.update({f"param.{k}": v for k, v in values.items()})
    return posted


def test_the_trigger_form_has_a_field_per_param_from_its_schema(staff_client):
    dag = DagFactory(dag_id="ingest", params=json.dumps(PARAMS))
    page = staff_client.get(reverse("admin:assets_app_dag_trigger", args=[dag.pk])).content
    text = page.decode()
    assert 'type="number" id="id_param_1" name="param.count" value="5" step="1" min="1"' in text
    assert '<option value="&quot;full&quot;" selected>full</option>' in text
    assert 'type="checkbox" id="id_param_3" name="param.dry" value="true">' in text
    assert 'name="param.tables" rows="3"' in text and "[\n  &quot;a&quot;\n]" in text
    assert 'type="date" id="id_param_5" name="param.day" value=""' in text
    assert "Which day · required (no default)" in text


def test_the_trigger_form_makes_the_conf_from_the_fields(staff_client):
    dag = DagFactory(dag_id="ingest", params=json.dumps(PARAMS))
    url = reverse("admin:assets_app_dag_trigger", args=[dag.pk])
    answer = staff_client.post(
        url,
        _fields(count="7", mode='"delta"', dry="true", tables='["a", "b"]', day="2026-12-01"),
    )
    assert answer.status_code == 302, answer.content.decode()[:3000]
    run = DagRun.objects.get()
    assert run.conf == {
        "count": 7,
        "mode": "delta",
        "dry": True,
        "tables": ["a", "b"],
        "day": "2026-12-01",
    }


def test_bad_fields_are_a_400_with_the_reason_and_write_nothing(staff_client):
    dag = DagFactory(dag_id="ingest", params=json.dumps(PARAMS))
    url = reverse("admin:assets_app_dag_trigger", args=[dag.pk])
    not_integer = staff_client.post(url, _fields(count="seven", day="2026-12-01"))
    assert not_integer.status_code == 400
    text = not_integer.content.decode()
    assert "Not triggered: count: &#x27;seven&#x27; is not an integer" in text
    assert 'name="param.count" value="seven"' in text  # the form keeps what was typed
    below = staff_client.post(url, _fields(count="0", day="2026-12-01"))
    assert below.status_code == 400
    assert (
        "Invalid input for param count: 0 is less than the minimum of 1" in below.content.decode()
    )
    missing = staff_client.post(url, _fields(count="3"))
    assert missing.status_code == 400
    assert "Invalid input for param day: No value passed" in missing.content.decode()
    bad_json = staff_client.post(url, _fields(tables="[a", day="2026-12-01"))
    assert bad_json.status_code == 400 and "tables: not valid JSON" in bad_json.content.decode()
    assert not DagRun.objects.exists() and not AuditEntry.objects.exists()


def test_a_big_dags_task_table_lists_its_first_tasks_in_order(staff_client, monkeypatch):
    monkeypatch.setattr(dags_admin, "TASK_INLINE_MAX", 3)
    dag = DagFactory(dag_id="big")
    made = [Task.objects.create(dag=dag, task_id=f"t{i}") for i in range(5)]
    # t4 runs first: the table follows the task order, not the ids.
    TaskUpstream.objects.create(task=made[0], upstream=made[4])
    text = staff_client.get(reverse("admin:assets_app_dag_change", args=[dag.pk])).content
    text = text.decode()
    assert "Tasks: the first 3 of 5 in task order" in text
    table = text[text.index('id="tasks-group"') :].split("</table>")[0]
    order = [r.task_id for r in task_order.dag_task_rows(dag_id="big") if r.task_id]
    assert order.index("t4") < order.index("t0")
    shown = sorted((table.index(f">{t}<"), t) for t in order if f">{t}<" in table)
    assert [t for _, t in shown] == order[:3]


def test_the_grid_shows_the_chosen_number_of_runs(staff_client):
    dag = DagFactory(dag_id="ran")
    for i in range(30):
        DagRunFactory(dag=dag, run_id=f"r{i:02}", state="success")
    url = reverse("admin:assets_app_dag_grid", args=[dag.pk])
    assert "The last 25 runs" in staff_client.get(url).content.decode()
    page = staff_client.get(url, {"runs": "50"}).content.decode()
    assert "The last 30 runs" in page and "<strong>50</strong>" in page
    assert "The last 25 runs" in staff_client.get(url, {"runs": "7"}).content.decode()
