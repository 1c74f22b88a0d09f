import time

from django.conf import settings
from django.core.management.base import BaseCommand

from assets_app.outbox import drain


class Command(BaseCommand):
    help = "Register outbox rows as asset events (the drain). Loops unless --once."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="drain until empty, then exit")
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--sleep", type=float, default=1.0, help="seconds between passes")

    def handle(self, *args, once, batch_size, sleep, **options):
        while True:
            result = drain.drain(batch_size=batch_size)
            if once or result.claimed:
                self.stdout.write(
                    f"drain: {result.registered} registered, {result.failed} failed "
                    f"({result.parked} parked), {result.events_written} events, "
                    f"{result.runs_triggered} runs in {result.batches} batches, "
                    f"{result.seconds:.2f}s (batch size "
                    f"{batch_size or settings.ASSET_QUEUE_BATCH_SIZE})"
                )
            if once:
                return
            time.sleep(sleep)
