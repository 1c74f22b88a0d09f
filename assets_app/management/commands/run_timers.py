from django.core.management.base import BaseCommand

from assets_app.timers import process


class Command(BaseCommand):
    help = (
        "Run the timers: time schedules and backfills, webhook delivery, freshness, run "
        "timeouts, retention and repair, each when it is due or woken by a NOTIFY (issue 41). "
        "A supervisor forks "
        "the timers again when they die; SIGTERM or Ctrl-C stops them. Any number may run."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-supervise",
            action="store_true",
            help="run the timers in this process (no supervisor to restart them)",
        )

    def handle(self, *args, no_supervise, **options):
        self.stdout.write("timers: time schedules, webhooks, freshness, retention, repair")
        if no_supervise:
            process.run_child()
        else:
            process.supervise()
