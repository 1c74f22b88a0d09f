"""XCom passing: return values (a dict, a list, None, a string) read by downstream tasks,
`multiple_outputs`, and an explicit push and pull."""

from airflow.sdk import dag, task


@dag(dag_id="diff_xcom_passing", schedule=None)
def xcom_passing():
    @task
    def numbers():
        return {"a": 1, "b": [2, 3], "c": {"d": None, "e": 1.5}}

    @task(multiple_outputs=True)
    def split():
        return {"left": "L", "right": 2}

    @task
    def nothing():
        return None

    @task
    def combine(numbers, left, right, nothing):
        return {
            "sum": numbers["a"] + sum(numbers["b"]),
            "left": left,
            "right": right * 2,
            "nothing": nothing,
        }

    @task
    def push(*, ti):
        ti.xcom_push(key="extra_key", value=["pushed", 7])
        return "pushed"

    @task
    def pull(*, ti):
        return ti.xcom_pull(task_ids="push", key="extra_key")

    parts = split()
    combine(numbers(), parts["left"], parts["right"], nothing())
    push() >> pull()


xcom_passing()
