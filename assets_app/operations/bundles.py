"""Which Dag bundles running workers serve (issue 44): each claim request that names its
bundles (`bin/airflow-worker --bundle`) records them (`record_claim`), and a Dag of a bundle no
worker claimed for within `SERVED_WITHIN` is unserved (`unserved_dags`: the Dag page and
`/healthz` name it), where before it would have waited, or been claimed by a worker of another
folder and bounced ("Dag not found during start up") for ever.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from ..models import Dag, WorkerBundle
from ..sql import claims as claims_sql

# A bundle's row is rewritten at most this often (a worker polls its claim every second or
# so when idle: one write per bundle per SEEN_EVERY, whatever the number of workers).
SEEN_EVERY = timedelta(seconds=30)
# A bundle no worker claimed for within this is unserved: a worker's claims stop for longer
# only when all its slots hold tasks that long, so 10 minutes names a gone worker without
# naming a busy one (a busy worker's next claim comes when a slot frees).
SERVED_WITHIN = timedelta(minutes=10)


def record_claim(*, hostname: str, bundles: Sequence[str], now: datetime | None = None) -> None:
    """Record that `hostname` asked for work of `bundles` at `now`: one INSERT ... ON CONFLICT
    that writes a bundle's row only when it is new or older than SEEN_EVERY (its own
    statement, outside the claim's transaction: it never lengthens the claim's locks)."""
    if not bundles:
        return
    now = now or timezone.now()
    claims_sql.record_worker_bundles(
        hostname=hostname, bundles=bundles, now=now, unless_since=now - SEEN_EVERY
    )


@dataclass(frozen=True)
class UnservedDag:
    dag_id: str
    bundle_name: str
    last_claim_at: datetime | None  # when a worker serving its bundle last claimed, if ever


def unserved_filter(now: datetime | None = None) -> Q:
    """Dags of a bundle (not JSON definitions) that no worker claimed for within
    SERVED_WITHIN."""
    since = (now or timezone.now()) - SERVED_WITHIN
    served = WorkerBundle.objects.filter(
        bundle_name=OuterRef("bundle_name"), last_claim_at__gte=since
    )
    return Q(bundle_name__isnull=False) & ~Q(Exists(served))


SHOWN = 20  # Dags named by `unserved_dags`


def unserved_dags(*, now: datetime | None = None) -> tuple[list[UnservedDag], int]:
    """The unpaused Dags no running worker serves (`unserved_filter`), at most SHOWN by dag_id,
    and how many there are. 3 queries."""
    query = Dag.objects.filter(unserved_filter(now), is_paused=False)
    count = query.count()
    if not count:
        return [], 0
    shown = [
        (dag_id, str(bundle))  # never None: `unserved_filter`
        for dag_id, bundle in query.order_by("dag_id").values_list("dag_id", "bundle_name")[:SHOWN]
    ]
    seen = dict(
        WorkerBundle.objects.filter(bundle_name__in={b for _, b in shown}).values_list(
            "bundle_name", "last_claim_at"
        )
    )
    return [UnservedDag(d, b, seen.get(b)) for d, b in shown], count
