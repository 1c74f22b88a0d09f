import time

from django.core.management.base import BaseCommand

from assets_app.scheduling import asset_runs as scheduling
from assets_app.scheduling import backfills
from assets_app.scheduling import time_runs as time_scheduling
from assets_app.task_state import repair


class Command(BaseCommand):
    help = (
        "Create asset-triggered Dag runs from queued events (and, without --dag, repair runs a "
        "crash left waiting and TIs whose worker died). Loops unless --once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--dag", action="append", dest="dag_ids", help="only this Dag")
        parser.add_argument("--sleep", type=float, default=1.0, help="seconds between passes")

    def handle(self, *args, once, dag_ids, sleep, **options):
        while True:
            if not dag_ids:
                repaired = repair.repair_task_instances()
                if any(vars(repaired).values()):
                    self.stdout.write(f"repair: {repaired}")
            result = scheduling.schedule_dags(dag_ids=dag_ids)
            if not dag_ids:
                timed = time_scheduling.create_due_runs()
                if once or timed.run_ids:
                    self.stdout.write(
                        f"time scheduler: {timed.dags_checked} dags due, "
                        f"{len(timed.run_ids)} runs created, {timed.seconds:.2f}s"
                    )
                filled = backfills.start_runs()
                if filled.run_ids or filled.reprocessed or filled.completed:
                    self.stdout.write(
                        f"backfills: {filled.backfills_checked} checked, "
                        f"{len(filled.run_ids) + len(filled.reprocessed)} runs started, "
                        f"{len(filled.completed)} completed"
                    )
            if once or result.run_ids:
                self.stdout.write(
                    f"scheduler: {result.dags_checked} dags checked, {len(result.run_ids)} runs "
                    f"created, {result.events_consumed} events consumed, {result.seconds:.2f}s"
                )
                for dag_id, run_id in result.run_ids:
                    self.stdout.write(f"  {dag_id} {run_id}")
            if once:
                return
            time.sleep(sleep)
