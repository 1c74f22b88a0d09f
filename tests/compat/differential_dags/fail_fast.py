"""fail_fast: the first failed task stops the run's remaining tasks (Airflow's `fail_fast=True`)."""

import time

from airflow.sdk import DAG, task

with DAG(dag_id="diff_fail_fast", schedule=None, fail_fast=True):

    @task
    def boom():
        raise RuntimeError("fails on purpose")

    @task
    def after_boom():
        return "ran"

    @task
    def slow():
        time.sleep(20)
        return "slept"

    @task
    def after_slow(value):
        return value

    boom() >> after_boom()
    after_slow(slow())
