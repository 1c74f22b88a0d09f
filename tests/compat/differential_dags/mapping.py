"""Dynamic task mapping: over a literal list, over an upstream's return value, with `partial`,
over keyword arguments (`expand_kwargs`), over an empty list, and a reduce over mapped results."""

from airflow.sdk import dag, task


@dag(dag_id="diff_mapping", schedule=None)
def mapping():
    @task
    def make():
        return [1, 2, 3, 4]

    @task
    def double(x):
        return x * 2

    @task
    def add(x, y):
        return x + y

    @task
    def total(values):
        return sum(values)

    @task
    def kwargs_list():
        return [{"x": 1, "y": 10}, {"x": 2, "y": 20}]

    @task
    def nothing():
        return []

    @task
    def never(x):
        return x

    @task
    def after_empty():
        return "after empty"

    total(double.expand(x=make()))
    add.partial(y=100).expand(x=[5, 6])
    add.expand_kwargs(kwargs_list())
    never.expand(x=nothing()) >> after_empty()


mapping()
