# The Airflow SDK check runs in its own virtualenv against a running server (see README.md);
# it is not part of the pytest suite. The REST client check runs in its own virtualenv too, driven
# by test_airflow_client.py.
collect_ignore = ["airflow_sdk_check.py", "airflow_client_check.py"]
