"""`python manage.py requeue_parked`: give parked outbox rows a fresh attempt budget.

Examples:
    python manage.py requeue_parked --all --dry-run     # what would be requeued, by Dag
    python manage.py requeue_parked --dag ingest        # every parked row of one Dag
    python manage.py requeue_parked --id 12 --id 13
    python manage.py requeue_parked --all --json        # machine-readable summary
"""

import json
from collections import Counter

from django.core.management.base import BaseCommand, CommandError

from assets_app.operations import audit
from assets_app.outbox import rows as outbox

# Rows per `outbox.requeue` call (one short durable transaction each), so a large requeue
# reports progress and never holds many row locks at once.
CHUNK = 1000
LISTED_ROWS = 50


class Command(BaseCommand):
    help = "Requeue parked outbox rows: attempts reset, unparked, due now."

    def add_arguments(self, parser):
        parser.add_argument(
            "--id", type=int, nargs="+", action="extend", dest="ids", help="row id(s)"
        )
        parser.add_argument("--dag", help="rows whose source Dag is this")
        parser.add_argument("--all", action="store_true", help="every parked row")
        parser.add_argument("--dry-run", action="store_true", help="list, change nothing")
        parser.add_argument("--json", action="store_true", help="print a JSON summary only")

    def handle(self, *args, ids, dag, all, dry_run, **options):
        as_json = options["json"]
        if not (ids or dag or all):
            raise CommandError("say which rows: --id N (repeatable), --dag DAG_ID or --all")
        rows = list(
            outbox.select_rows(ids=ids, dag_id=dag, parked=True).values_list(
                "id", "source_dag_id", "source_task_id", "try_number", "attempts", "last_error"
            )
        )
        dag_of = {row[0]: row[1] for row in rows}
        if not as_json:
            self._list(rows, verbose=options["verbosity"] >= 2)
        requeued: list[int] = []
        if not dry_run:
            actor = audit.Actor.os_user()
            for start in range(0, len(rows), CHUNK):
                requeued += outbox.requeue(
                    row_ids=[row[0] for row in rows[start : start + CHUNK]], actor=actor
                )
                if len(rows) > CHUNK and not as_json:
                    self.stderr.write(f"  ... {min(start + CHUNK, len(rows))}/{len(rows)} rows")
        selected_by_dag = Counter(dag_of.values())
        requeued_by_dag = Counter(dag_of[i] for i in requeued)
        # Asked for by id but not parked (or gone), and selected but held by a drain: named, and
        # the command fails, so a script notices.
        not_parked = sorted(set(ids or ()) - set(dag_of))
        held = [] if dry_run else sorted(set(dag_of) - set(requeued))
        if as_json:
            self.stdout.write(
                self._json(rows, requeued, selected_by_dag, requeued_by_dag, dry_run, not_parked)
            )
            self._fail_for(not_parked, held)
            return
        if dry_run:
            self.stdout.write(f"dry run: would requeue {len(rows)} parked rows")
        else:
            skipped = len(rows) - len(requeued)
            self.stdout.write(
                f"requeued {len(requeued)} parked rows"
                + (f" ({skipped} skipped: held by a drain right now)" if skipped else "")
            )
        if selected_by_dag:
            done = "would requeue" if dry_run else "requeued"
            self.stdout.write(f"{'dag':<40} {'parked':>8} {done:>14}")
            for dag_id, count in sorted(selected_by_dag.items()):
                shown = count if dry_run else requeued_by_dag[dag_id]
                self.stdout.write(f"{dag_id:<40} {count:>8} {shown:>14}")
        self._fail_for(not_parked, held)

    def _fail_for(self, not_parked: list[int], held: list[int]) -> None:
        problems = []
        if not_parked:
            problems.append(f"not parked or not found: {audit.ids_text(not_parked)}")
        if held:
            problems.append(
                f"held by a drain right now, not requeued (run again): {audit.ids_text(held)}"
            )
        if problems:
            raise CommandError("could not requeue rows " + "; ".join(problems))

    def _list(self, rows, *, verbose: bool) -> None:
        for row_id, dag_id, task_id, try_number, attempts, last_error in (
            rows if verbose else rows[:LISTED_ROWS]
        ):
            error = (last_error or "-").strip().splitlines()[0] if last_error else "-"
            self.stdout.write(
                f"  row {row_id}: {dag_id}.{task_id} try {try_number}, "
                f"{attempts} attempts, last error: {error}"
            )
        if not verbose and len(rows) > LISTED_ROWS:
            self.stdout.write(f"  ... and {len(rows) - LISTED_ROWS} more (-v 2 lists all)")

    @staticmethod
    def _json(rows, requeued, selected_by_dag, requeued_by_dag, dry_run, not_parked) -> str:
        return json.dumps(
            {
                "dry_run": dry_run,
                "selected": len(rows),
                "requeued": len(requeued),
                "skipped": 0 if dry_run else len(rows) - len(requeued),
                "requeued_ids": requeued,
                "not_parked_ids": not_parked,
                "skipped_ids": [] if dry_run else sorted({row[0] for row in rows} - set(requeued)),
                "by_dag": {
                    dag_id: {"parked": count, "requeued": requeued_by_dag[dag_id]}
                    for dag_id, count in sorted(selected_by_dag.items())
                },
            },
            indent=2,
        )
