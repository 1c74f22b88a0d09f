"""`python manage.py sync_dags PATH...`: load DAG definition files (or directories of *.json)."""

from django.core.management.base import BaseCommand, CommandError

from assets_app.catalog import queued_events
from assets_app.definitions import sync as definitions
from assets_app.operations import audit


class Command(BaseCommand):
    help = (
        "Validate DAG definition JSON files (directories: their *.json, sorted) and upsert their "
        "Dags, tasks, outlets and schedules in one transaction. Nothing is written on any error. "
        "A definition's is_paused applies when the Dag is created; afterwards the pause is the "
        "operator's (Airflow's is_paused_upon_creation) unless --apply-pause."
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH")
        parser.add_argument(
            "--apply-pause",
            action="store_true",
            help="set every stored Dag's pause to its definition's is_paused (undoes operators')",
        )
        parser.add_argument(
            "--clear-unscheduled",
            action="store_true",
            help="clear queued events waiting on assets no longer in their Dag's schedule",
        )

    def handle(self, *args, paths: list[str], apply_pause: bool, clear_unscheduled: bool, **_):
        try:
            result = definitions.sync_dags(
                paths=paths, apply_pause=apply_pause, actor=audit.Actor.os_user()
            )
        except definitions.DefinitionError as exc:
            raise CommandError(f"{exc}\nnothing was written") from exc
        self.stdout.write(result.summary())
        if clear_unscheduled and result.unscheduled_waiting:
            actor = audit.Actor.os_user()
            for dag_id, _count in result.unscheduled_waiting:
                cleared = queued_events.clear_unscheduled_queued_events(dag_id=dag_id, actor=actor)
                self.stdout.write(f"dag {dag_id}: cleared {cleared} unscheduled queued events")
