"""The operator admin: one module per area. Importing them registers every model."""

from django.contrib import admin

from . import (  # noqa: F401
    assets,
    audit,
    backfills,
    dags,
    dashboard,
    events,
    queue,
    runs,
    settings,
    tokens,
    watchers,
    webhooks,
)
from .dashboard import dashboard_view

# The top navigation (base_site.html) and the grouped index replace Django's model sidebar,
# which took 300 px of every page.
admin.site.enable_nav_sidebar = False

__all__ = ["dashboard_view"]
