"""`manage.py qcluster`: django-q2's own command, running only the checks a cluster needs.

The cluster's first process runs the system checks before it forks the sentinel, monitor, pusher
and workers, and every one of them carries what the checks loaded. Django's URL checks import
the whole web tier (the API's views and pydantic models, the admin's pages): an idle cluster's
six processes summed 450 MB of RSS that way, 350 MB without the checks (bench: 74 / 58 / 54 /
54 / 54 / 56 MB each). Kept: the service's settings and key checks (`assets_app.guards.checks`,
tagged "assets_app" and security) and Django's model checks, so a cluster with a broken setting
still refuses to start. This command wins over django-q2's because `assets_app` comes first in
INSTALLED_APPS.
"""

from django.core import checks
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand


class Command(DjangoQClusterCommand):
    requires_system_checks = ["assets_app", checks.Tags.security, checks.Tags.models]
