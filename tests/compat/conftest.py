# The Airflow SDK check runs in its own virtualenv against a running server (see README.md);
# it is not part of the pytest suite. The REST client check runs in its own virtualenv too, driven
# by test_airflow_client.py.
import os

import pytest
from cryptography.fernet import Fernet

from tests import servers as live_servers

# The live-server fixtures of the proof suites (gunicorn / qcluster on the test database).
from tests.proof.conftest import database_url, servers, service_env  # noqa: F401

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
