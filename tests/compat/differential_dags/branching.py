"""Branching: `choose` follows its run's conf (default "left"); `right` and what follows it are
skipped; `join` runs with none_failed_min_one_success, `strict` (all_success) is skipped."""

from airflow.sdk import dag, task


@dag(dag_id="diff_branching", schedule=None)
def branching():
    @task.branch
    def choose(*, dag_run):
        return (dag_run.conf or {}).get("path", "left")

    @task
    def left():
        return "went left"

    @task
    def right():
        return "went right"

    @task
    def after_right():
        return "after right"

    @task(trigger_rule="none_failed_min_one_success")
    def join():
        return "joined"

    @task
    def strict():
        return "strict"

    paths = choose()
    ends = [join(), strict()]
    paths >> left() >> ends
    paths >> right() >> after_right() >> ends


branching()
