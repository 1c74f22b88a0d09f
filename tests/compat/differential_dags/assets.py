"""Asset outlets with extra: an event per outlet, an extra set through `outlet_events`, a second
asset without one, and a failing task whose outlet gets no event."""

from airflow.sdk import Asset, dag, task

ORDERS = Asset("diff_orders", uri="file:///tmp/differential/orders.csv")
REPORT = Asset("diff_report", uri="file:///tmp/differential/report.csv")
NEVER = Asset("diff_never", uri="file:///tmp/differential/never.csv")


@dag(dag_id="diff_assets", schedule=None)
def assets():
    @task(outlets=[ORDERS])
    def produce(*, outlet_events):
        outlet_events[ORDERS].extra = {"rows": 3, "nested": {"ok": True}}
        return 3

    @task(outlets=[REPORT])
    def report():
        return "reported"

    @task(outlets=[NEVER])
    def fail():
        raise RuntimeError("no event for a failed task")

    produce() >> report()
    fail()


assets()
