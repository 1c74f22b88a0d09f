"""`python manage.py pools`: list, set and delete pools (Airflow's `airflow pools` CLI).

Examples:
    python manage.py pools list
    python manage.py pools set gpu 4 "the two cards"   # create, or change slots and description
    python manage.py pools set default_pool 64         # default_pool: only its slots change
    python manage.py pools delete gpu
"""

from django.core.management.base import BaseCommand, CommandError

from assets_app.guards import exceptions
from assets_app.models import DEFAULT_POOL_NAME, Pool
from assets_app.operations import audit
from assets_app.runtime import pools


class Command(BaseCommand):
    help = "List, set (create or update) and delete pools."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every pool with its slots")
        setting = sub.add_parser("set", help="create a pool, or change its slots/description")
        setting.add_argument("name")
        setting.add_argument("slots", type=int, help="-1: unlimited")
        setting.add_argument("description", nargs="?", default=None)
        setting.add_argument("--include-deferred", action="store_true")
        deleting = sub.add_parser("delete", help="delete a pool (not default_pool)")
        deleting.add_argument("name")

    def handle(self, *args, action, **options):
        actor = audit.Actor.os_user()
        try:
            if action == "set":
                self._set(options, actor)
            elif action == "delete":
                pools.delete_pool(name=options["name"], actor=actor)
                self.stdout.write(f"deleted pool {options['name']}")
        except exceptions.DomainError as exc:
            raise CommandError(exc.message) from None
        for found in pools.with_slots(list(Pool.objects.order_by("name"))):
            shown = "unlimited" if found.open is None else found.open
            self.stdout.write(
                f"{found.pool.name}\tslots {found.pool.slots}\trunning {found.running}\t"
                f"claimed {found.queued}\topen {shown}\t{found.pool.description or ''}"
            )

    def _set(self, options, actor) -> None:
        name = options["name"]
        changes = {
            "slots": options["slots"],
            "description": options["description"],
            "include_deferred": options["include_deferred"],
        }
        if not Pool.objects.filter(name=name).exists():
            pools.create_pool(name=name, actor=actor, **changes)
            return
        mask = ["slots", "include_deferred"]
        if name != DEFAULT_POOL_NAME and options["description"] is not None:
            mask.append("description")
        pools.update_pool(name=name, changes=changes, update_mask=mask, actor=actor)
