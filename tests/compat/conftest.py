# The Airflow SDK check runs in its own virtualenv against a running server (see README.md);
# it is not part of the pytest suite.
collect_ignore = ["airflow_sdk_check.py"]
