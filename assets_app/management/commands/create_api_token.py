"""`python manage.py create_api_token USERNAME [--name N]`: print a new public API key once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from assets_app.api import public_auth
from assets_app.operations import audit


class Command(BaseCommand):
    help = "Create a public API (/api/v2/) token acting as USERNAME; prints the key once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token (default: cli)")

    def handle(self, *args, username: str, name: str, **options):
        try:
            token, key = public_auth.create_api_token(
                username=username, name=name, actor=audit.Actor.os_user()
            )
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"no user named {username!r}") from exc
        self.stdout.write(f"created token {token.pk} ({token.name}) for {token.user}; key:")
        self.stdout.write(key)
