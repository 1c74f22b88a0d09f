from django.core.management.base import BaseCommand, CommandError

from assets_app.operations import audit
from assets_app.watchers import messages as watchers


class Command(BaseCommand):
    help = (
        "Route parked queue-watcher messages again under the current routes (after adding a "
        "route): those that now match are registered, the others stay parked."
    )

    def add_arguments(self, parser):
        parser.add_argument("--id", type=int, action="append", default=[], dest="ids")
        parser.add_argument("--watcher", action="append", default=[], metavar="NAME")
        parser.add_argument("--all", action="store_true", help="every parked message")

    def handle(self, *args, ids, watcher, all, **options):
        if not ids and not watcher and not all:
            raise CommandError("name messages with --id, --watcher NAME or --all")
        actor = audit.Actor.os_user()
        if ids:
            result = watchers.requeue_parked(ids=ids, actor=actor)
        else:
            result = watchers.requeue_all_parked(watcher_names=watcher, actor=actor)
        self.stdout.write(
            f"{len(result.registered)} registered, {len(result.still_parked)} still parked"
        )
