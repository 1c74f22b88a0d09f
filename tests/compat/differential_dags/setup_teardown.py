"""Setup and teardown tasks (issue 39): a teardown runs after its work failed and the run
fails for the work; the teardown's own failure is ignored unless `on_failure_fail_dagrun`; a
failed setup fails the work and its teardown (no setup succeeded); a task two steps after a
setup waits for it (Airflow's indirect setup)."""

from airflow.sdk import DAG, setup, task, teardown


@setup
def create():
    return "created"


@setup
def create_broken():
    raise RuntimeError("setup fails on purpose")


@task
def work(value=None):
    return f"worked on {value}"


@task
def boom(value=None):
    raise RuntimeError("work fails on purpose")


@task
def after(value=None):
    return value


def delete(*, on_failure_fail_dagrun=False):
    """A fresh `@teardown` per use (the decorated object sets its trigger rule once)."""

    @teardown(on_failure_fail_dagrun=on_failure_fail_dagrun)
    def delete(value=None):
        return "deleted"

    return delete


def delete_broken(*, on_failure_fail_dagrun=False):
    @teardown(on_failure_fail_dagrun=on_failure_fail_dagrun)
    def delete_broken(value=None):
        raise RuntimeError("teardown fails on purpose")

    return delete_broken


with DAG(dag_id="diff_setup_teardown_work_fails", schedule=None):
    s = create()
    b = boom(s)
    after(b)
    b >> delete()(s)

with DAG(dag_id="diff_setup_teardown_passes", schedule=None):
    s = create()
    w2 = after(work(s))
    w2 >> delete()(s)

with DAG(dag_id="diff_setup_teardown_teardown_fails", schedule=None):
    s = create()
    work(s) >> delete_broken()(s)

with DAG(dag_id="diff_setup_teardown_fail_dagrun", schedule=None):
    s = create()
    work(s) >> delete_broken(on_failure_fail_dagrun=True)(s)

with DAG(dag_id="diff_setup_teardown_setup_fails", schedule=None):
    s = create_broken()
    work(s) >> delete()(s)
