"""bench/airflow_worker.py's Dag for the comparison with Airflow's own scheduler and
LocalExecutor (issue 27): fifty independent tasks that do nothing. Airflow's side lifts its
per-Dag task limit by setting (the service refuses a Dag's own `max_active_tasks`, issue 39)."""

from airflow.sdk import dag, task


@dag(dag_id="bench_fifty", schedule=None, is_paused_upon_creation=False)
def bench_fifty():
    for i in range(50):
        task(task_id=f"noop_{i:02d}")(lambda: None)()


bench_fifty()
