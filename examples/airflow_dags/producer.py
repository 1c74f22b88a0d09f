"""Producer: a manual Dag whose task returns a value (an XCom) and writes asset `af_orders`,
with an extra on the event, and emits `af_orders_clean` through the alias `af_cleaned`."""

from airflow.sdk import Asset, AssetAlias, dag, task

ORDERS = Asset("af_orders", uri="file:///tmp/airflow-demo/orders.csv")
CLEANED = AssetAlias("af_cleaned")


@dag(dag_id="af_producer", schedule=None, tags=["example"], is_paused_upon_creation=False)
def producer():
    @task(outlets=[ORDERS, CLEANED])
    def produce(*, outlet_events):
        outlet_events[ORDERS].extra = {"rows": 3}
        outlet_events[CLEANED].add(
            Asset("af_orders_clean", uri="file:///tmp/airflow-demo/orders_clean.csv"),
            extra={"cleaned": True},
        )
        return {"rows": 3, "file": ORDERS.uri}

    produce()


producer()
