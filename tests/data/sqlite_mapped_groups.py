"""Mapped task groups on SQLite (issue 25), run by `tests/test_mapping.py` in a process of its
own on a migrated SQLite file (the suite itself runs on PostgreSQL only): the SQLite evaluation
statement and `mapping.expand` through the same domain functions as the worker API. Prints one
JSON object: the states (map index, state) of the group's tasks at each step."""

import json

import django

django.setup()

from django.utils import timezone  # noqa: E402

from assets_app.definitions import sync as definitions  # noqa: E402
from assets_app.models import DagRun, TaskInstance, TIState  # noqa: E402
from assets_app.runtime import xcoms  # noqa: E402
from assets_app.scheduling import runs  # noqa: E402
from assets_app.task_state import finishing, starting, success  # noqa: E402


def group_dag(dag_id: str, expand: dict) -> dict:
    return {
        "dag_id": dag_id,
        "is_paused": False,  # a sync pauses a new Dag unless it says so (issue 39)
        "tasks": [
            {"task_id": "src"},
            {"task_id": "g.a", "upstream": ["src"], "map_group": "g", "expand": expand},
            {"task_id": "g.b", "upstream": ["g.a"], "map_group": "g", "expand": expand},
            {"task_id": "after", "upstream": ["g.b"]},
        ],
    }


def states(run: DagRun, task_id: str) -> list[list]:
    rows = TaskInstance.objects.filter(dag_run=run, task_id=task_id).order_by("map_index")
    return [list(row) for row in rows.values_list("map_index", "state")]


def run_ti(run: DagRun, task_id: str, map_index: int = -1, *, returned=None, failed=False):
    ti = TaskInstance.objects.get(dag_run=run, task_id=task_id, map_index=map_index)
    tries = {"ti_id": ti.id, "try_number": ti.try_number}
    starting.start(**tries, hostname="h", unixname="u", pid=1, start_date=timezone.now())
    if failed:
        finishing.finish(**tries, state=TIState.FAILED, end_date=timezone.now())
        return
    if isinstance(returned, list):
        xcoms.push(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=task_id,
            key="return_value",
            value=returned,
            map_index=map_index,
            mapped_length=len(returned),
        )
    success.succeed(**tries, end_date=timezone.now(), task_outlets=[], outlet_events=[])


seen: dict[str, object] = {}
dags = [
    group_dag("literal", {"x": [1, 2, 3, 4, 5]}),
    group_dag("xcom", {"x": {"xcom": "src"}}),
    group_dag("empty", {"x": {"xcom": "src"}}),
]
definitions.sync_definitions(
    dags=[d for dag in dags for d in definitions.parse_text(json.dumps(dag), file="g.json")]
)
for dag_id in ("literal", "xcom"):
    run = runs.trigger_dag(dag_id=dag_id)
    run_ti(run, "src", returned=list(range(5)))
    seen[f"{dag_id}: expanded"] = [states(run, "g.a"), states(run, "g.b")]
    run_ti(run, "g.a", 2)
    seen[f"{dag_id}: a[2] succeeded"] = states(run, "g.b")
    run_ti(run, "g.a", 3, failed=True)
    seen[f"{dag_id}: a[3] failed"] = states(run, "g.b")
    run_ti(run, "g.a", 0)
    seen[f"{dag_id}: a[0] succeeded"] = states(run, "g.b")
# Outside the group: waits for every map index of b.
run = runs.trigger_dag(dag_id="xcom")
run_ti(run, "src", returned=[1, 2, 3])
for i in range(3):
    run_ti(run, "g.a", i)
waits = []
for i in range(3):
    waits.append(states(run, "after"))
    run_ti(run, "g.b", i)
waits.append(states(run, "after"))
seen["after waits"] = waits
run = runs.trigger_dag(dag_id="empty")
run_ti(run, "src", returned=[])
seen["zero length"] = [states(run, task_id) for task_id in ("g.a", "g.b", "after")]
print(json.dumps(seen))
