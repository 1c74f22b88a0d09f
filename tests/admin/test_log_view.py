"""Issue 45: task logs as Airflow prints them, escaped, with groups, colours and tracebacks."""

import json

from django.urls import reverse

from assets_app.admin import log_view
from assets_app.models import TaskLogChunk
from tests.factories import DagRunFactory, TaskInstanceFactory

ERROR_DETAIL = [
    {
        "exc_type": "RuntimeError",
        "exc_value": "load failed",
        "exc_notes": [],
        "syntax_error": None,
        "is_cause": False,
        "frames": [
            {"filename": "/dags/etl.py", "lineno": 12, "name": "load"},
            {"filename": "/dags/lib.py", "lineno": 3, "name": "write"},
        ],
        "is_group": False,
        "exceptions": [],
    },
    {
        "exc_type": "KeyError",
        "exc_value": "'orders'",
        "is_cause": True,
        "frames": [{"filename": "/dags/lib.py", "lineno": 9, "name": "lookup"}],
    },
]


def record(**fields) -> str:
    return json.dumps({"timestamp": "2026-12-02T14:00:00Z", "level": "info", **fields}) + "\n"


def test_a_record_prints_as_airflow_prints_it_without_the_context_keys():
    line = log_view.record_line(
        {
            "timestamp": "2026-12-02T14:00:00.000001Z",
            "level": "info",
            "event": "Pushing xcom",
            "ti_id": "0193",
            "dag_id": "etl",
            "task_id": "load",
            "run_id": "manual__1",
            "try_number": 1,
            "map_index": -1,
            "logger": "airflow.task",
            "filename": "taskinstance.py",
            "lineno": 42,
            "rows": [1, 2],
        }
    )
    assert line == (
        "[2026-12-02T14:00:00.000001Z] INFO - Pushing xcom source=airflow.task rows=[1, 2] "
        "loc=taskinstance.py:42"
    )


def test_error_detail_is_a_python_traceback_the_cause_first():
    text = log_view.traceback_text(ERROR_DETAIL)
    assert text == (
        "Traceback (most recent call last):\n"
        '  File "/dags/lib.py", line 9, in lookup\n'
        "KeyError: 'orders'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/dags/etl.py", line 12, in load\n'
        '  File "/dags/lib.py", line 3, in write\n'
        "RuntimeError: load failed"
    )


def test_ansi_colours_are_spans_and_everything_else_is_escaped():
    html = log_view.ansi_html("\x1b[1;31mfailed\x1b[0m <b>&\x1b[2K \x1b[38;5;46mgreen\x1b[39m")
    assert html == (
        '<span class="aes-ansi" style="font-weight:bold;color:#cd3131">failed</span>'
        " &lt;b&gt;&amp; "
        '<span class="aes-ansi" style="color:rgb(0,255,0)">green</span>'
    )
    # A code that cannot be a colour injects nothing into the style attribute.
    assert log_view.ansi_html('\x1b[38;2;999;0;0m"x') == (
        '<span class="aes-ansi" style="color:rgb(255,0,0)">&quot;x</span>'
    )


def test_groups_fold_and_a_script_stays_text():
    html = log_view.render(
        [
            {"event": "::group::Installing <deps>"},
            {"event": "<script>alert(1)</script>", "level": "info"},
            {"event": "::endgroup::"},
            {"event": "after", "level": "error", "error_detail": ERROR_DETAIL[:1]},
            {"event": "::group::never closed"},
            {"event": "inside"},
        ]
    )
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.startswith(
        '<details class="aes-log-group"><summary>Installing &lt;deps&gt;</summary>'
    )
    assert html.count("<details") == html.count("</details>") == 2
    assert '<div class="aes-log-line aes-log-error">ERROR - after</div>' in html
    assert "RuntimeError: load failed</div>" in html


def test_the_ti_page_opens_on_the_log_with_a_tab_per_try(staff_client):
    ti = TaskInstanceFactory(dag_run=DagRunFactory(), task_id="load", state="failed", try_number=2)
    first = record(event="first try <script>x</script>", ti_id=str(ti.id))
    second = record(event="boom", level="error", error_detail=ERROR_DETAIL) + record(
        event="\x1b[32mok\x1b[0m"
    )
    for n, text in ((1, first), (2, second)):
        TaskLogChunk.objects.create(
            ti=ti, try_number=n, offset=0, size=len(text.encode()), content=text
        )
    page = staff_client.get(
        reverse("admin:assets_app_taskinstance_change", args=[ti.pk])
    ).content.decode()
    # The log comes before the fields.
    assert page.index('id="task-log"') < page.index("Dag run:")
    assert 'id="aes-log-try-1" class="aes-log-radio">' in page
    assert 'id="aes-log-try-2" class="aes-log-radio" checked>' in page
    assert "[2026-12-02T14:00:00Z] INFO - first try &lt;script&gt;x&lt;/script&gt;" in page
    assert "ti_id=" not in page
    assert "Traceback (most recent call last):" in page
    assert '<span class="aes-ansi" style="color:#0dbc79">ok</span>' in page


def _failed_run(n_failed: int):
    run = DagRunFactory(state="failed")
    TaskInstanceFactory(dag_run=run, task_id="ok", succeeded=True)
    for i in range(n_failed):
        ti = TaskInstanceFactory(dag_run=run, task_id=f"load_{i}", state="failed", try_number=2)
        old = record(event="the first try's line", level="error", error_detail=ERROR_DETAIL[1:])
        text = "".join(record(event=f"line {k} <i>") for k in range(30)) + record(
            event="Task failed with exception", level="error", error_detail=ERROR_DETAIL
        )
        for n, content in ((1, old), (2, text)):
            TaskLogChunk.objects.create(
                ti=ti, try_number=n, offset=0, size=len(content.encode()), content=content
            )
    return run


def test_a_failed_run_shows_its_failed_tis_last_lines_and_error(
    staff_client, django_assert_num_queries
):
    run = _failed_run(1)
    url = reverse("admin:assets_app_dagrun_change", args=[run.pk])
    staff_client.get(url)
    # session, user, the run, its Dag, the Dag's shape (tasks, upstream: the task order and
    # the graph), its TIs, events, outbox rows, deletions, the failed logs, the consumed events,
    # their aliases.
    with django_assert_num_queries(12) as pinned:
        page = staff_client.get(url).content.decode()
    assert "No output of this run was lost." not in page
    assert page.index('id="run-failed"') < page.index("Run id:")
    assert "<strong>1</strong> task instance of this run failed" in page
    excerpt = page[page.index('id="run-failed"') : page.index("Run id:")]
    # The current try's last 20 records, escaped; not the first try's log.
    assert "line 29 &lt;i&gt;" in excerpt and "line 11 &lt;i&gt;" in excerpt
    assert "line 10 &lt;i&gt;" not in excerpt and "the first try" not in excerpt
    assert "RuntimeError: load failed" in excerpt and "KeyError: &#x27;orders&#x27;" in excerpt
    # Flat in the number of failed TIs.
    more = _failed_run(6)
    url = reverse("admin:assets_app_dagrun_change", args=[more.pk])
    with django_assert_num_queries(len(pinned.captured_queries)):
        page = staff_client.get(url).content.decode()
    assert "<strong>6</strong> task instances of this run failed" in page


def test_a_successful_run_still_says_no_output_was_lost(staff_client):
    run = DagRunFactory(state="success")
    TaskInstanceFactory(dag_run=run, task_id="ok", succeeded=True)
    page = staff_client.get(reverse("admin:assets_app_dagrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "No output of this run was lost." in text and 'id="run-failed"' not in text
