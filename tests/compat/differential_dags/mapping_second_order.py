"""Second-order mapping: a task mapped over a mapped task's output (one map index per return
value its map indexes pushed: a map index that returned None or was skipped pushed none), also
through `.map(f)` and `.expand_kwargs`, and over a mapped task that pushed nothing (skipped)."""

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowSkipException


@dag(dag_id="diff_mapping_second_order", schedule=None)
def mapping_second_order():
    @task
    def numbers():
        return [1, 2, 3, 4, 5]

    @task
    def first(x):
        if x == 2:
            return None  # pushes nothing: not counted
        if x == 4:
            raise AirflowSkipException("skipped: pushes nothing")
        return x * 10

    @task(trigger_rule="none_failed")
    def second(x):
        return x + 1

    @task(trigger_rule="none_failed")
    def mapped_through(x):
        return x

    @task
    def as_kwargs(x):
        return {"x": x, "y": x * 2}

    @task
    def add(x, y):
        return x + y

    @task
    def total(values):
        return sum(values)

    @task
    def silent(x):
        return None

    @task(trigger_rule="all_done")
    def over_nothing(x):
        return x

    firsts = first.expand(x=numbers())
    total(second.expand(x=firsts))
    mapped_through.expand(x=firsts.map(lambda value: value * 100))
    add.expand_kwargs(as_kwargs.expand(x=[1, 2]))
    over_nothing.expand(x=silent.expand(x=[1, 2]))


mapping_second_order()
