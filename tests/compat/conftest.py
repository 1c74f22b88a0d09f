# The Airflow SDK check runs in its own virtualenv against a running server (see README.md);
# it is not part of the pytest suite. The REST client check runs in its own virtualenv too, driven
# by test_airflow_client.py.
collect_ignore = ["airflow_sdk_check.py", "airflow_client_check.py"]

# The live-server fixtures of the proof suites (gunicorn / qcluster on the test database).
from tests.proof.conftest import servers, service_env  # noqa: E402, F401
