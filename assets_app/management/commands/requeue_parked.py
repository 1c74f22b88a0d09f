from django.core.management.base import BaseCommand, CommandError

from assets_app import outbox


class Command(BaseCommand):
    help = "Requeue parked outbox rows: attempts reset, unparked, due now."

    def add_arguments(self, parser):
        parser.add_argument("--id", type=int, action="append", dest="ids", help="row id")
        parser.add_argument("--dag", help="rows whose source Dag is this")
        parser.add_argument("--all", action="store_true", help="every parked row")
        parser.add_argument("--dry-run", action="store_true", help="list, change nothing")

    def handle(self, *args, ids, dag, all, dry_run, **options):
        if not (ids or dag or all):
            raise CommandError("say which rows: --id N (repeatable), --dag DAG_ID or --all")
        rows = list(outbox.select_rows(ids=ids, dag_id=dag, parked=True))
        for row in rows:
            self.stdout.write(
                f"  row {row.id}: {row.source_dag_id}.{row.source_task_id} try {row.try_number}, "
                f"{row.attempts} attempts, last error: {row.last_error or '-'}"
            )
        if dry_run:
            self.stdout.write(f"dry run: would requeue {len(rows)} parked rows")
            return
        requeued = outbox.requeue(row_ids=[row.id for row in rows])
        skipped = len(rows) - len(requeued)
        self.stdout.write(
            f"requeued {len(requeued)} parked rows"
            + (f" ({skipped} skipped: held by a drain right now)" if skipped else "")
        )
