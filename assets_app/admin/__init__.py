"""The operator admin: one module per area. Importing them registers every model."""

from . import assets, audit, dags, dashboard, events, queue, runs, tokens  # noqa: F401
from .dashboard import dashboard_view

__all__ = ["dashboard_view"]
