"""`python manage.py run_worker`: the reference worker over HTTP
(assets_app/operations/reference_worker.py).

Examples:
    python manage.py run_worker --url http://127.0.0.1:8000                 # until Ctrl-C
    python manage.py run_worker --concurrency 8 --task-seconds 0.5 --max-tis 100
    python manage.py run_worker --fail-probability 0.2 --retry-delay 0 --max-seconds 60
"""

import socket

from django.conf import settings
from django.core.management.base import BaseCommand

from assets_app.operations.reference_worker import ReferenceWorker, WorkerConfig


class Command(BaseCommand):
    help = "Claim, start, heartbeat and finish task instances over the worker API."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="server root URL")
        parser.add_argument("--api-key", default=None, help="default: settings.WORKER_API_KEY")
        parser.add_argument("--hostname", default=socket.gethostname())
        parser.add_argument("--concurrency", "--limit", type=int, default=4, dest="concurrency")
        parser.add_argument("--task-seconds", type=float, default=1.0)
        parser.add_argument("--heartbeat-seconds", type=float, default=5.0)
        parser.add_argument("--fail-probability", type=float, default=0.0)
        parser.add_argument("--retry-delay", type=float, default=None, dest="retry_delay_seconds")
        parser.add_argument("--once", action="store_true", help="one claim round, then exit")
        parser.add_argument("--max-tis", type=int, default=None, help="exit after N TIs")
        parser.add_argument("--max-seconds", type=float, default=None, help="exit after S s")

    def handle(self, *args, **options):
        config = WorkerConfig(
            url=options["url"],
            api_key=options["api_key"] or settings.WORKER_API_KEY,
            hostname=options["hostname"],
            concurrency=options["concurrency"],
            task_seconds=options["task_seconds"],
            heartbeat_seconds=options["heartbeat_seconds"],
            fail_probability=options["fail_probability"],
            retry_delay_seconds=options["retry_delay_seconds"],
            once=options["once"],
            max_tis=options["max_tis"],
            max_seconds=options["max_seconds"],
        )
        ReferenceWorker(config, out=self.stdout).run()
