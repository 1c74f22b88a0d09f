"""`python manage.py dag_schema [--output PATH]`: write the JSON Schema of DAG definition files."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from assets_app.definitions import schema as dag_schema

PUBLISHED = "docs/dag-definition.schema.json"


class Command(BaseCommand):
    help = (
        "Write the JSON Schema of DAG definition files, generated from the models sync_dags "
        f"validates with, to {PUBLISHED} (the committed copy DAG authors use), or to --output."
    )

    def add_arguments(self, parser):
        parser.add_argument("--output", metavar="PATH", help="another file, or - for stdout")

    def handle(self, *args, output: str | None, **_):
        text = dag_schema.json_schema_text()
        if output == "-":
            self.stdout.write(text, ending="")
            return
        path = Path(output) if output else Path(settings.BASE_DIR) / PUBLISHED
        path.write_text(text, encoding="utf-8")
        self.stdout.write(f"wrote {path}")
