import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from assets_app.watchers import consumer as watcher_consumer
from assets_app.watchers import messages as watchers


class Command(BaseCommand):
    help = (
        "Consume the queue watchers' RabbitMQ queues into asset events (every enabled watcher, "
        "or those named). Runs until SIGTERM or Ctrl-C; any number may run at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--watcher", action="append", default=[], metavar="NAME")

    def handle(self, *args, watcher, **options):
        unknown = watchers.unknown_watcher_names(names=watcher)
        if unknown:
            raise CommandError(f"no queue watcher named {', '.join(unknown)}")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"watching queues of {', '.join(watcher) or 'every enabled watcher'}")
        watcher_consumer.run(names=watcher, stop=stop)
