"""The operator admin: one module per area. Importing them registers every model.

Owns: the admin pages (lists, change pages, the dashboard, the lineage page) and their actions
(requeue, park, clear, pause, replay, rotate, revoke).

Writes: nothing itself: every action calls the domain function that owns the write (`outbox`,
`catalog.queued_events`, `scheduling`, `events_out`, `watchers`...), audited there.

May import: every layer and shared package (a door); no domain module imports it.
"""

from django.contrib import admin

from . import (  # noqa: F401
    assets,
    audit,
    backfills,
    callbacks,
    dags,
    dashboard,
    events,
    hitl,
    pools,
    queue,
    runs,
    settings,
    tokens,
    users,
    watchers,
    webhooks,
)
from .dashboard import dashboard_view

# The top navigation (base_site.html) and the grouped index replace Django's model sidebar,
# which took 300 px of every page.
admin.site.enable_nav_sidebar = False

__all__ = ["dashboard_view"]
