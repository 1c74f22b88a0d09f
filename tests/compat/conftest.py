# The Airflow SDK check runs in its own virtualenv against a running server (see README.md);
# it is not part of the pytest suite. The REST client check runs in its own virtualenv too, driven
# by test_airflow_client.py.
import os

import pytest
from cryptography.fernet import Fernet

from tests import servers as live_servers

# The live-server fixtures of the proof suites (gunicorn / qcluster on the test database).
from tests.proof.conftest import (  # noqa: F401
    GUNICORN_ARGS,
    database_url,
    servers,
    service_env,
    service_environment,
)

collect_ignore = ["airflow_sdk_check.py", "airflow_client_check.py", "airflow_scheduler_driver.py"]


@pytest.fixture
def service(tmp_path):
    """`bin/serve` (web, cluster, watcher) on the test database, as an operator starts it, for
    the stock Airflow worker's end-to-end tests: its URL, environment and log file."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "WEB_WORKERS": "2",
        "WORKER_API_KEY": "acceptance-worker-key",
        "FERNET_KEY": Fernet.generate_key().decode(),
        "ADMIN_PASSWORD": "acceptance-admin",
    }
    log = tmp_path / "serve.log"
    with live_servers.bin_serve(env, log, ready_path="/api/v2/version", ready_timeout=120) as serve:
        yield {"url": serve.url, "env": serve.env, "log": log}


@pytest.fixture(scope="module")
def module_web(request, django_db_setup, tmp_path_factory):
    """One gunicorn on the test database for all the stock-worker tests of a module that ask
    for it (`servers("gunicorn")` starts one per test): the service starts once. The tests stay
    independent: each has its own Dag ids, DAG folder, worker and triggerer, the database is
    flushed after each (transaction=True) while this server is idle, and the service keeps no
    rows in memory across requests. The module's `SERVICE_ENV` (a dict), if any, is added to
    the server's environment."""
    folder = tmp_path_factory.mktemp("module-web")
    env = {
        **service_environment(folder / "prometheus"),
        **getattr(request.module, "SERVICE_ENV", {}),
    }
    server = live_servers.gunicorn(env, folder / "gunicorn.log", args=GUNICORN_ARGS)
    yield server
    server.stop(timeout=3)
