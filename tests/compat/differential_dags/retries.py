"""Retries: one task fails its first try and succeeds on its second; one fails every try."""

from datetime import timedelta

from airflow.sdk import dag, task


@dag(dag_id="diff_retries", schedule=None)
def retries():
    @task(retries=2, retry_delay=timedelta(seconds=1))
    def flaky(*, ti):
        if ti.try_number == 1:
            raise RuntimeError("first try fails on purpose")
        return ti.try_number

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def hopeless():
        raise RuntimeError("every try fails on purpose")

    @task
    def after(value):
        return value * 10

    after(flaky())
    hopeless()


retries()
