"""bench/airflow_worker.py's Dag for the comparison with Airflow's own scheduler and
LocalExecutor (issue 27): fifty independent tasks that do nothing."""

from airflow.sdk import dag, task


@dag(dag_id="bench_fifty", schedule=None, max_active_tasks=64)
def bench_fifty():
    for i in range(50):
        task(task_id=f"noop_{i:02d}")(lambda: None)()


bench_fifty()
