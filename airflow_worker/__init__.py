"""`bin/airflow-worker`: runs Airflow DAG files against the service with the stock Task SDK.

This package runs in the worker's own virtualenv (requirements-airflow.txt), never in the
service's, and imports nothing of the service: it talks to it over HTTP only.
"""
