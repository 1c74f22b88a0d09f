import os

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
            self.stdout.write("admin login: use your existing superuser")
            return
        note = " (generated, shown only now)" if login.generated else ""
        self.stdout.write(
            f"admin login: user {login.username!r}, password {login.password!r}{note}"
        )
