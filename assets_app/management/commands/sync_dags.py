"""`python manage.py sync_dags PATH...`: load DAG definition files (or directories of *.json)."""

from django.core.management.base import BaseCommand, CommandError

from assets_app import definitions


class Command(BaseCommand):
    help = (
        "Validate DAG definition JSON files (directories: their *.json, sorted) and upsert their "
        "Dags, tasks, outlets and schedules in one transaction. Nothing is written on any error."
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH")

    def handle(self, *args, paths: list[str], **options):
        try:
            result = definitions.sync_dags(paths=paths)
        except definitions.DefinitionError as exc:
            raise CommandError(f"{exc}\nnothing was written") from exc
        self.stdout.write(result.summary())
