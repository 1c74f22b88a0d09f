"""TriggerDagRunOperator: `af_trigger` starts a run of `af_target` with a conf, which
`af_target` reads and returns."""

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import dag, task


@dag(dag_id="af_trigger", schedule=None, tags=["example"], is_paused_upon_creation=False)
def trigger():
    TriggerDagRunOperator(
        task_id="start_target",
        trigger_dag_id="af_target",
        trigger_run_id="triggered_by_{{ run_id }}",
        conf={"from": "af_trigger"},
    )


@dag(dag_id="af_target", schedule=None, tags=["example"], is_paused_upon_creation=False)
def target():
    @task
    def read_conf(*, dag_run):
        return dag_run.conf

    read_conf()


trigger()
target()
