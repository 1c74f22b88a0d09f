import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the first superuser if none exists, and print how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default=None, help="default: $ADMIN_PASSWORD or 'admin'")

    def handle(self, *args, username, password, **options):
        users = get_user_model().objects
        if users.filter(is_superuser=True).exists():
            self.stdout.write("admin login: use your existing superuser")
            return
        password = password or os.environ.get("ADMIN_PASSWORD", "admin")
        users.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"admin login: user {username!r}, password {password!r}")
