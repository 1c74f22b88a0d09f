"""Reschedule-mode sensor: the first poke is not done and gives the worker slot back (the TI is
requeued for 2 seconds later); the second poke is done and hands its value on."""

from airflow.sdk import PokeReturnValue, dag, task


@dag(dag_id="af_sensor", schedule=None, tags=["example"], is_paused_upon_creation=False)
def sensor():
    @task.sensor(poke_interval=2, timeout=300, mode="reschedule")
    def wait_for_second_poke(*, task_reschedule_count):
        return PokeReturnValue(is_done=task_reschedule_count >= 1, xcom_value=task_reschedule_count)

    wait_for_second_poke()


sensor()
