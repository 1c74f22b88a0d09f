"""Trigger rules: a task per rule joins three upstreams (one succeeds, one is skipped, one fails),
in two Dags that differ in the order the upstreams finish (`ok`, then `skip`, then `boom`; or `ok`,
`boom`, `skip`). Airflow decides a join as soon as the upstreams done so far settle it (all_success
is skipped or upstream_failed by whichever of the two came first), so the order is fixed here with
all_done links: a race would make either outcome right."""

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowSkipException

RULES = [
    "all_success",
    "all_failed",
    "all_done",
    "all_skipped",
    "one_success",
    "one_failed",
    "one_done",
    "none_failed",
    "none_failed_min_one_success",
    "none_skipped",
    "always",
]


def trigger_rules(dag_id: str, *, skip_first: bool):
    @dag(dag_id=dag_id, schedule=None)
    def rules():
        @task
        def ok():
            return "ok"

        @task(trigger_rule="all_done")
        def boom():
            raise RuntimeError("fails on purpose")

        @task(trigger_rule="all_done")
        def skip():
            raise AirflowSkipException("skipped on purpose")

        first, second = (skip(), boom()) if skip_first else (boom(), skip())
        upstream = [ok(), first, second]
        upstream[0] >> first >> second
        for rule in RULES:

            @task(task_id=f"after_{rule}", trigger_rule=rule)
            def join(rule=rule):
                return rule

            upstream >> join()

    return rules()


trigger_rules("diff_trigger_rules_skip_first", skip_first=True)
trigger_rules("diff_trigger_rules_fail_first", skip_first=False)
