"""`python manage.py backfill DAG --from DATE --to DATE [...]`: Airflow's `backfill create`."""

import json
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError

from assets_app.guards import exceptions
from assets_app.models import ReprocessBehavior
from assets_app.operations import audit
from assets_app.scheduling import backfills


def _date(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(f"{text!r} is not an ISO 8601 date") from exc
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Backfill DAG over [--from, --to] (ISO 8601; without an offset, UTC): plans one run per "
        "logical date of its timetable and starts the first --max-active-runs of them; the "
        "scheduler starts the others as those finish. --dry-run prints the dates only."
    )

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("--from", dest="from_date", required=True, type=_date)
        parser.add_argument("--to", dest="to_date", required=True, type=_date)
        parser.add_argument(
            "--reprocess-behavior", choices=ReprocessBehavior.values, default="none"
        )
        parser.add_argument("--max-active-runs", type=int, default=10)
        parser.add_argument("--run-backwards", action="store_true")
        parser.add_argument("--conf", default=None, help="the runs' conf, a JSON object")
        parser.add_argument("--dry-run", action="store_true", help="print the dates, write nothing")

    def handle(self, *args, dag_id, from_date, to_date, conf, dry_run, **options):
        try:
            parsed = json.loads(conf) if conf is not None else None
        except json.JSONDecodeError as exc:
            raise CommandError(f"--conf is not valid JSON: {exc}") from exc
        plan = {
            "dag_id": dag_id,
            "from_date": from_date,
            "to_date": to_date,
            "run_backwards": options["run_backwards"],
            "reprocess_behavior": options["reprocess_behavior"],
            "max_active_runs": options["max_active_runs"],
            "dag_run_conf": parsed,
        }
        try:
            if dry_run:
                for date in backfills.plan_backfill(**plan):
                    reason = f" (skipped: {date.exception_reason})" if date.exception_reason else ""
                    self.stdout.write(f"{date.logical_date.isoformat()}{reason}")
                return
            backfill = backfills.create_backfill(**plan, actor=audit.Actor.os_user())
        except exceptions.DomainError as exc:
            raise CommandError(exc.message) from exc
        counts = backfills.summary(backfill)
        self.stdout.write(
            f"created backfill {backfill.pk} of dag {dag_id}: {counts['created']} run(s) "
            f"started, {counts['pending']} pending, {counts['skipped']} skipped"
        )
