"""fail_fast: the first failed task stops the run's remaining tasks (Airflow's `fail_fast=True`):
`after_boom` is skipped, not upstream_failed. Only tasks that cannot have started when `boom`
fails are in the Dag: a task running in parallel would end failed or skipped by timing (the
first CI run of this file saw both)."""

from airflow.sdk import DAG, task

with DAG(dag_id="diff_fail_fast", schedule=None, fail_fast=True):

    @task
    def boom():
        raise RuntimeError("fails on purpose")

    @task
    def after_boom():
        return "ran"

    @task
    def last(value):
        return value

    last(after_boom()) << boom()
