"""Human-in-the-loop details as the public API lists and shows them (issue 42; Airflow 3.3.2's
`core_api/routes/public/hitl.py`): one page of a run's (or every run's, `~`) details with their
TIs, filtered and ordered by Airflow's names; one TI's detail. Reads only."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from ..guards.exceptions import NotFound
from ..models import HITLDetail, TaskInstance
from . import listing

ORDERING = listing.Ordering(
    keys={
        "ti_id": "ti_id",
        "subject": "subject",
        "responded_at": "responded_at",
        "created_at": "created_at",
        "responded_by_user_id": "responded_by__id",
        "responded_by_user_name": "responded_by__name",
        "dag_id": "ti__dag_id",
        "run_id": "ti__dag_run__run_id",
        "task_display_name": "ti__task_id",
        "run_after": "ti__dag_run__run_after",
        "task_instance_state": "ti__state",
    },
    default=("ti_id",),
    pk="ti_id",
)


@dataclass(frozen=True)
class HITLFilters:
    """Airflow's list filters, by their query names."""

    dag_id_pattern: str | None = None
    dag_id_prefix_pattern: str | None = None
    task_id: str | None = None
    task_id_pattern: str | None = None
    task_id_prefix_pattern: str | None = None
    map_index: int | None = None
    state: Sequence[str] = ()
    response_received: bool | None = None
    responded_by_user_id: Sequence[str] = ()
    responded_by_user_name: Sequence[str] = ()
    subject_search: str | None = None
    body_search: str | None = None
    created_at_gte: datetime | None = None
    created_at_gt: datetime | None = None
    created_at_lte: datetime | None = None
    created_at_lt: datetime | None = None


def list_details(
    *,
    dag_id: str,
    run_id: str,
    filters: HITLFilters,
    order_by: Sequence[str] | None,
    limit: int,
    offset: int,
) -> listing.Page:
    """A page of details (`~` for every Dag or run), each with its TI and run loaded: two
    queries (count, page)."""
    query = HITLDetail.objects.select_related("ti", "ti__dag_run")
    if dag_id != "~":
        query = query.filter(ti__dag_id=dag_id)
    if run_id != "~":
        query = query.filter(ti__dag_run__run_id=run_id)
    q = listing.pattern_q("ti__dag_id", filters.dag_id_pattern)
    q &= listing.pattern_q("ti__task_id", filters.task_id_pattern)
    q &= listing.prefix_q("ti__dag_id", filters.dag_id_prefix_pattern)
    q &= listing.prefix_q("ti__task_id", filters.task_id_prefix_pattern)
    q &= listing.range_q(
        "created_at",
        gte=filters.created_at_gte,
        gt=filters.created_at_gt,
        lte=filters.created_at_lte,
        lt=filters.created_at_lt,
    )
    q &= listing.pattern_q("subject", filters.subject_search)
    q &= listing.pattern_q("body", filters.body_search)
    if filters.task_id is not None:
        q &= Q(ti__task_id=filters.task_id)
    if filters.map_index is not None:
        q &= Q(ti__map_index=filters.map_index)
    if filters.state:
        q &= Q(ti__state__in=list(filters.state))
    if filters.response_received is not None:
        q &= Q(responded_at__isnull=not filters.response_received)
    if filters.responded_by_user_id:
        q &= Q(responded_by__id__in=list(filters.responded_by_user_id))
    if filters.responded_by_user_name:
        q &= Q(responded_by__name__in=list(filters.responded_by_user_name))
    return listing.offset_page(
        query.filter(q), ORDERING, order_by=order_by, limit=limit, offset=offset
    )


def get_detail(*, dag_id: str, run_id: str, task_id: str, map_index: int) -> HITLDetail:
    """One TI's detail with its TI and run, or Airflow's 404s (no such TI; no detail)."""
    ti = (
        TaskInstance.objects.select_related("dag_run")
        .filter(dag_id=dag_id, dag_run__run_id=run_id, task_id=task_id, map_index=map_index)
        .first()
    )
    if ti is None:
        raise NotFound(
            f"The Task Instance with dag_id: `{dag_id}`, run_id: `{run_id}`, task_id: "
            f"`{task_id}` and map_index: `{map_index}` was not found"
        )
    detail = HITLDetail.objects.filter(ti=ti).first()
    if detail is None:
        raise NotFound(f"Human-in-the-loop detail does not exist for Task Instance with id {ti.id}")
    detail.ti = ti
    return detail
