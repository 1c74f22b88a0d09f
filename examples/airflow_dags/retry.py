"""Retry: the first try fails, the second (after a 2-second delay) succeeds."""

from datetime import timedelta

from airflow.sdk import dag, task


@dag(dag_id="af_retry", schedule=None, tags=["example"], is_paused_upon_creation=False)
def retry():
    @task(retries=2, retry_delay=timedelta(seconds=2))
    def flaky(*, ti):
        if ti.try_number == 1:
            raise RuntimeError("first try fails on purpose")
        return ti.try_number

    flaky()


retry()
