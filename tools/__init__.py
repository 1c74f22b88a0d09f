"""Operator tools that are not part of the service: the differential harness against Airflow."""
