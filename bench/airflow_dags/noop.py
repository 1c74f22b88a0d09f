"""bench/airflow_worker.py's Dag: eight independent tasks that do nothing."""

from airflow.sdk import dag, task


@dag(dag_id="bench_noop", schedule=None)
def bench_noop():
    for i in range(8):
        task(task_id=f"noop_{i}")(lambda: None)()


bench_noop()
