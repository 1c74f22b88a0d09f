"""Short-circuit: a false condition skips everything downstream (whatever its trigger rule, as
`ignore_downstream_trigger_rules` is true by default); a true one lets it run."""

from airflow.sdk import dag, task


@dag(dag_id="diff_short_circuit", schedule=None)
def short_circuit():
    @task.short_circuit
    def no():
        return 0

    @task.short_circuit
    def yes():
        return {"go": True}

    @task
    def after_no():
        return "not reached"

    @task(trigger_rule="all_done")
    def after_no_all_done():
        return "not reached either"

    @task
    def after_yes():
        return "reached"

    no() >> after_no() >> after_no_all_done()
    yes() >> after_yes()


short_circuit()
