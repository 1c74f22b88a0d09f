import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from assets_app.guards import exceptions, exposure


class Command(BaseCommand):
    help = (
        "Create the first superuser if none exists, and print how to log in (the password once: "
        "$ADMIN_PASSWORD, else a random one; beyond loopback it must be set and valid)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default=None, help="default: $ADMIN_PASSWORD or random")

    def handle(self, *args, username, password, **options):
        try:
            login = exposure.ensure_superuser(
                username=username, password=password or os.environ.get("ADMIN_PASSWORD") or None
            )
        except exceptions.DomainError as exc:
            raise CommandError(exc.message) from exc
        if login is None:
            # The password was shown once, at the first start (issue 44): say how to reset it.
            names = (
                get_user_model()
                .objects.filter(is_superuser=True, is_active=True)
                .order_by("id")
                .values_list("username", flat=True)[:1]
            )
            name = names[0] if names else username
            self.stdout.write(
                f"admin login: use your existing superuser ({name!r}); to reset its password: "
                f".venv/bin/python manage.py changepassword {name}"
            )
            return
        note = " (generated, shown only now)" if login.generated else ""
        self.stdout.write(
            f"admin login: user {login.username!r}, password {login.password!r}{note}"
        )
