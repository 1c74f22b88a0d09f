"""Consumer: runs when `af_orders` and (through alias `af_cleaned`) a cleaned asset both have
new events, or when `af_orders_manual` has one. It reads the events that triggered it and the
producer's return value (xcom_pull from the run that wrote the event)."""

from airflow.sdk import Asset, AssetAlias, dag, task

ORDERS = Asset("af_orders", uri="file:///tmp/airflow-demo/orders.csv")
MANUAL = Asset("af_orders_manual", uri="file:///tmp/airflow-demo/orders_manual.csv")


@dag(
    dag_id="af_consumer",
    schedule=(ORDERS & AssetAlias("af_cleaned")) | MANUAL,
    tags=["example"],
    is_paused_upon_creation=False,
)
def consumer():
    @task
    def consume(*, triggering_asset_events, ti):
        seen = []
        for asset, events in sorted(triggering_asset_events.items(), key=lambda kv: kv[0].name):
            for event in events:
                pushed = ti.xcom_pull(
                    dag_id=event.source_dag_id,
                    task_ids=event.source_task_id,
                    run_id=event.source_run_id,
                )
                seen.append(
                    {"asset": asset.name, "extra": event.extra, "producer_returned": pushed}
                )
        return seen

    consume()


consumer()
