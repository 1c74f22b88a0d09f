"""`python manage.py trigger_dag DAG_ID [--conf JSON]`: create a manual run and its queued TIs."""

import json

from django.core.management.base import BaseCommand, CommandError

from assets_app.guards import exceptions
from assets_app.models import DagRunTriggeredBy
from assets_app.operations import audit
from assets_app.scheduling import runs


class Command(BaseCommand):
    help = "Trigger a manual run of DAG_ID; prints its run_id and the task instances queued."

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("--conf", default=None, help="a JSON object, e.g. '{\"day\": 3}'")

    def handle(self, *args, dag_id: str, conf: str | None, **options):
        try:
            parsed = json.loads(conf) if conf is not None else None
        except json.JSONDecodeError as exc:
            raise CommandError(f"--conf is not valid JSON: {exc}") from exc
        try:
            actor = audit.Actor.os_user()
            run = runs.trigger_dag(
                dag_id=dag_id,
                conf=parsed,
                triggering_user_name=actor.name,
                actor=actor,
                triggered_by=DagRunTriggeredBy.CLI,
            )
        except exceptions.DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"created run {run.run_id} of dag {dag_id}")
        for ti in run.task_instances.order_by("task_id"):
            self.stdout.write(f"  queued {ti.task_id} try {ti.try_number} (ti {ti.id})")
