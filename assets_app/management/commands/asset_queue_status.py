import dataclasses
import json

from django.core.management.base import BaseCommand

from assets_app.outbox import rows as outbox


class Command(BaseCommand):
    help = "Show the outbox and queued-event backlog: pending, due, parked, oldest age, by Dag."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args, **options):
        status = outbox.queue_status()
        if options["json"]:
            self.stdout.write(json.dumps(dataclasses.asdict(status), indent=2))
            return
        age = status.oldest_pending_age_seconds
        self.stdout.write(
            f"outbox: {status.pending} pending ({status.due} due now), {status.parked} parked, "
            f"oldest pending {'-' if age is None else f'{age:.1f}s'} old; "
            f"{status.queued_events} queued events (ADRQ)"
        )
        if status.by_dag:
            self.stdout.write(f"{'dag':<40} {'pending':>8} {'parked':>8} {'queued':>8}")
            for row in status.by_dag:
                self.stdout.write(
                    f"{row.dag_id:<40} {row.pending:>8} {row.parked:>8} {row.queued_events:>8}"
                )
