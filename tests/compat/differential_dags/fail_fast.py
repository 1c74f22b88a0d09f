"""fail_fast: the first failed task stops the run's remaining tasks (Airflow's `fail_fast=True`):
`after_boom` is skipped, not upstream_failed. Only tasks that cannot have started when `boom`
fails are in the Dag, both downstream of it: a task running in parallel ends failed (running
when `boom` fails), skipped (not started) or success (done before) by timing, on either side
(CI runs saw all three)."""

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

    after = after_boom()
    boom() >> after
    last(after)
