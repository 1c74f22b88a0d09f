"""Branch: `choose` picks one path from its run's conf (default "left"); the other is skipped,
and `join` runs anyway (trigger rule none_failed_min_one_success)."""

from airflow.sdk import dag, task


@dag(dag_id="af_branch", schedule=None, tags=["example"], is_paused_upon_creation=False)
def branch():
    @task.branch
    def choose(*, dag_run):
        return (dag_run.conf or {}).get("path", "left")

    @task
    def left():
        return "went left"

    @task
    def right():
        return "went right"

    @task(trigger_rule="none_failed_min_one_success")
    def join():
        return "joined"

    paths = choose()
    paths >> [left(), right()] >> join()


branch()
