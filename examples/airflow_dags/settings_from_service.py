"""Variable and Connection: reads Variable `af_greeting` and Connection `af_warehouse` that an
operator created in the service (admin or /api/v2), and writes Variable `af_last_reader`."""

from airflow.sdk import BaseHook, Variable, dag, task


@dag(dag_id="af_settings", schedule=None, tags=["example"], is_paused_upon_creation=False)
def settings_from_service():
    @task
    def read_settings():
        connection = BaseHook.get_connection("af_warehouse")
        Variable.set("af_last_reader", "af_settings.read_settings")
        return {
            "greeting": Variable.get("af_greeting"),
            "host": connection.host,
            "login": connection.login,
            "password_length": len(connection.password or ""),
            "extra": connection.extra_dejson,
        }

    read_settings()


settings_from_service()
