from django.core.management.base import BaseCommand

from assets_app.cluster import sweeps


class Command(BaseCommand):
    help = "Create or update the django-q2 sweep schedules (drain, scheduler). Idempotent."

    def handle(self, *args, **options):
        for ensured in sweeps.ensure_schedules():
            verb = "created" if ensured.created else "updated"
            self.stdout.write(f"{verb} schedule {ensured.name} -> {ensured.func} every minute")
