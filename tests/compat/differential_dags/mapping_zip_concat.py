"""Mapping over several task outputs (issue 39): `zip` (the shortest; with a fillvalue the
longest), `concat` (every value of each, a dict's keys too), over unmapped and mapped outputs (a
map index that returned None or was skipped pushed nothing), through `.map(f)` and
`.expand_kwargs`, with an empty output (zip skipped, concat and a filled zip not), a zip
over an output that was never pushed (its task failed: nothing to map over, upstream_failed),
and mapped task groups over a mapped task's output and over a zip."""

from airflow.sdk import dag, task, task_group
from airflow.sdk.exceptions import AirflowSkipException


@task
def numbers():
    return [1, 2, 3]


@task
def letters():
    return ["a", "b"]


@task
def keyed():
    return {"k": 1, "l": 2}


@task
def empty():
    return []


@task
def show(value):
    return list(value) if isinstance(value, tuple) else value


@dag(dag_id="diff_mapping_zip_concat", schedule=None)
def mapping_zip_concat():
    @task
    def double(x):
        if x == 2:
            return None  # pushes nothing: not counted
        if x == 3:
            raise AirflowSkipException("skipped: pushes nothing")
        return x * 2

    @task
    def pair(a, b):
        return [a, b]

    n, ls, k, e = numbers(), letters(), keyed(), empty()
    doubled = double.expand(x=[1, 2, 3, 4])
    show.override(task_id="zipped").expand(value=n.zip(ls))
    show.override(task_id="filled").expand(value=n.zip(ls, fillvalue="-"))
    show.override(task_id="joined").expand(value=n.concat(ls, k, n).map(lambda v: f"<{v}>"))
    show.override(task_id="zip_mapped", trigger_rule="none_failed").expand(
        value=doubled.zip(n.map(lambda v: v * 100))
    )
    show.override(task_id="concat_mapped", trigger_rule="none_failed").expand(
        value=doubled.concat(n)
    )
    show.override(task_id="zip_empty").expand(value=n.zip(e))
    show.override(task_id="filled_empty").expand(value=e.zip(n, fillvalue=0))
    show.override(task_id="concat_empty").expand(value=e.concat(e, ls))
    pair.expand_kwargs(n.zip(ls).map(lambda p: {"a": p[0], "b": p[1]}))


mapping_zip_concat()


@dag(dag_id="diff_mapping_zip_missing", schedule=None)
def mapping_zip_missing():
    @task
    def nothing():
        return None  # a mapped task depends on it: the Task SDK fails it (nothing to map over)

    show.override(task_id="over_missing", trigger_rule="all_done").expand(
        value=numbers().zip(nothing())
    )
    show.override(task_id="concat_missing", trigger_rule="all_done").expand(
        value=numbers().concat(nothing())
    )


mapping_zip_missing()


@dag(dag_id="diff_mapping_group_over_mapped", schedule=None)
def mapping_group_over_mapped():
    """Mapped task groups over a mapped task's output (one map index per value it pushed) and
    over a zip of outputs (the shorter's length)."""

    @task
    def first(x):
        if x == 2:
            return None  # pushes nothing: not counted
        return x * 10

    @task(trigger_rule="none_failed")
    def add_one(x):
        return x + 1

    @task
    def twice(x):
        return x * 2

    @task_group
    def over_mapped(x):
        twice(add_one(x))

    @task
    def join(pair):
        return "-".join(map(str, pair))

    @task_group
    def over_zip(pair):
        show(join(pair))

    over_mapped.expand(x=first.expand(x=[1, 2, 3]))
    over_zip.expand(pair=numbers().zip(letters()))


mapping_group_over_mapped()
