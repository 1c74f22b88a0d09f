"""Outlets -> AssetEvents, alias links and ADRQ rows: the only writer of those tables.

A payload (format in `outbox/rows.py`) becomes events like this:

- each declared outlet asset gets one event per outlet-event entry naming it (that entry's
  `extra`), or one event with an empty extra when no entry names it;
- an outlet-event entry emitted through an alias (`source_alias_name`) that is a declared outlet
  creates the alias -> asset link, creates the target asset when it is unknown (with
  `dest_asset_extra` as its extra), and records the alias on the event. Entries for the same
  (asset, extra) through several aliases become one event carrying all those aliases, as Airflow
  does;
- every other entry (an asset or alias the task did not declare) is ignored and counted;
- an outlet declared by reference (`AssetNameRef` / `AssetUriRef`, as the Airflow SDK sends for
  `Asset.ref(name=...)`) names an asset that must already exist: it is resolved to that asset's
  (name, uri) first, and a reference to no known asset is skipped with a warning, as Airflow does.

`source_ordinal` is the position of the event among the events of its asset in that payload, so
(source TI, try, asset, ordinal) identifies an event and the unique constraint on it makes a
re-registration write nothing. ADRQ rows are written for new events only (an event a Dag has
already consumed must not be queued again): one per (Dag scheduled on the asset, event) and per
(Dag scheduled on an alias the event came through, event), paused Dags included, inserted sorted
by (target_dag_id, asset_event_id) (invariant 7).

Everything is set-based: registering a batch of payloads issues a fixed number of queries however
many payloads, outlets and Dags there are.
"""

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from uuid import UUID

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..cluster import nudges
from ..guards import exceptions, limits
from ..models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetAliasEvent,
    AssetEvent,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
)
from ..models.assets import ASSET_KEY_MAX_LENGTH
from ..operations import audit, metrics
from ..sql import registration as registration_sql
from .payloads import OutboxPayload

AssetKey = tuple[str, str]  # (name, uri)
logger = logging.getLogger(__name__)
# Outlet types that refer to an existing asset by one of its keys.
REFERENCE_TYPES: dict[str, Literal["name", "uri"]] = {"AssetNameRef": "name", "AssetUriRef": "uri"}
if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

K = TypeVar("K", bound="SupportsRichComparison")
EventKey = registration_sql.EventKey


def in_lock_order(keys: Iterable[K]) -> list[K]:
    """`keys` in the service's one global order for the unique keys a transaction inserts:
    new assets (name, uri), new aliases, alias -> asset links and ADRQ rows (target_dag_id,
    asset_event_id, ...) (invariant 7). Two transactions inserting some of the same keys wait
    for each other key by key (INSERT ... ON CONFLICT waits for the other's outcome); in one
    order that is a queue, in two orders a deadlock. Every such insert goes through here, and
    the deadlock proof (tests/proof/test_deadlocks.py) breaks it on purpose as its control."""
    return sorted(keys)


def check_constraints_immediately() -> None:
    """Check foreign keys per statement for the rest of the current transaction.

    Django's foreign keys on PostgreSQL are DEFERRABLE INITIALLY DEFERRED: checked, and their
    FOR KEY SHARE locks taken, at COMMIT. Callers of registration need them checked as each
    insert runs: the drain so that a failing row fails inside its own savepoint (not the whole
    batch at COMMIT), inline success so that checking thousands of event and ADRQ keys does not
    happen at COMMIT while the TI lock is held. Call it first in the caller's transaction."""
    registration_sql.set_constraints_immediate()


class RegistrationError(exceptions.InvalidInput):
    """A payload that cannot be registered as it is (the drain retries and finally parks it)."""

    reason = "registration_failed"


@dataclass(frozen=True)
class RegistrationResult:
    """What registering one payload did. `event_ids` lists every event of the payload (new or
    already registered), in emission order; `events_written` counts the new ones."""

    event_ids: tuple[int, ...]
    events_written: int
    ignored_outlet_events: int
    queued_rows: int
    dag_ids: frozenset[str]
    # Events the whole payload makes (its emission order is fixed): a caller registering it in
    # windows (`register_payloads(windows=...)`) is done when its window reaches this.
    emissions: int = 0


@dataclass
class _Emission:
    """One event to be: its asset, extra and the aliases it came through."""

    payload_index: int
    key: AssetKey
    extra: dict[str, Any]
    alias_names: list[str] = field(default_factory=list)
    ordinal: int = 0


@dataclass
class _Plan:
    emissions: list[_Emission] = field(default_factory=list)
    # Per asset key, the extra to give it if it must be created (declared outlets: empty).
    new_asset_extra: dict[AssetKey, dict[str, Any]] = field(default_factory=dict)
    ignored: list[int] = field(default_factory=list)  # per payload
    sources: list[dict[str, Any]] = field(default_factory=list)  # per payload
    emission_counts: list[int] = field(default_factory=list)  # per payload, before windowing

    def keep_windows(self, windows: Sequence[tuple[int, int | None]]) -> None:
        """Keep, of each payload's emissions (in their fixed order), those in its window
        [start, stop), and only the assets those need."""
        position: dict[int, int] = defaultdict(int)
        kept = []
        for e in self.emissions:
            start, stop = windows[e.payload_index]
            at = position[e.payload_index]
            position[e.payload_index] = at + 1
            if at >= start and (stop is None or at < stop):
                kept.append(e)
        self.emissions = kept
        wanted = {e.key for e in kept}
        self.new_asset_extra = {k: v for k, v in self.new_asset_extra.items() if k in wanted}


def _asset_key(raw: Any, *, where: str) -> AssetKey:
    if not isinstance(raw, dict):
        raise RegistrationError(f"{where}: asset key must be an object, got {type(raw).__name__}")
    name, uri = raw.get("name"), raw.get("uri")
    name, uri = name or uri, uri or name
    if not isinstance(name, str) or not isinstance(uri, str) or not name or not uri:
        raise RegistrationError(f"{where}: asset key needs a non-empty name or uri")
    if max(len(name), len(uri)) > ASSET_KEY_MAX_LENGTH:
        raise RegistrationError(
            f"{where}: asset name/uri longer than {ASSET_KEY_MAX_LENGTH} characters"
        )
    return name, uri


def _source(payload: OutboxPayload, *, where: str) -> dict[str, Any]:
    source = payload.get("source")
    if not isinstance(source, dict):
        raise RegistrationError(f"{where}.source: missing")
    try:
        return {
            "ti_id": UUID(str(source["ti_id"])),
            "dag_id": str(source["dag_id"]),
            "run_id": str(source["run_id"]),
            "task_id": str(source["task_id"]),
            "map_index": int(source.get("map_index", -1)),
            "try_number": int(source["try_number"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistrationError(f"{where}.source: {type(exc).__name__}: {exc}") from exc


def _plan(payloads: Sequence[OutboxPayload]) -> _Plan:
    """Turn payloads into emissions (pure Python, no queries)."""
    plan = _Plan()
    for index, payload in enumerate(payloads):
        where = f"payload[{index}]"
        first = len(plan.emissions)
        if not isinstance(payload, dict):
            raise RegistrationError(f"{where}: must be an object")
        plan.sources.append(_source(payload, where=where))
        # Ordered (emission order) and hashed: a list's `in` made 100,000 outlets quadratic.
        declared_assets: dict[AssetKey, None] = {}
        declared_aliases: set[str] = set()
        for i, outlet in enumerate(payload.get("outlets") or []):
            if not isinstance(outlet, dict):
                raise RegistrationError(f"{where}.outlets[{i}]: must be an object")
            if outlet.get("type", "Asset") == "AssetAlias":
                if not isinstance(outlet.get("name"), str) or not outlet["name"]:
                    raise RegistrationError(f"{where}.outlets[{i}]: alias needs a name")
                declared_aliases.add(outlet["name"])
            else:
                key = _asset_key(outlet, where=f"{where}.outlets[{i}]")
                if key not in declared_assets:
                    declared_assets[key] = None
                    plan.new_asset_extra.setdefault(key, {})

        direct: dict[AssetKey, list[dict[str, Any]]] = defaultdict(list)
        # (asset, canonical extra) -> emission, so several aliases share one event.
        through_alias: dict[tuple[AssetKey, str], _Emission] = {}
        ignored = 0
        for i, event in enumerate(payload.get("outlet_events") or []):
            at = f"{where}.outlet_events[{i}]"
            if not isinstance(event, dict):
                raise RegistrationError(f"{at}: must be an object")
            key = _asset_key(event.get("dest_asset_key"), where=f"{at}.dest_asset_key")
            extra = event.get("extra") or {}
            if not isinstance(extra, dict):
                raise RegistrationError(f"{at}.extra: must be an object")
            alias_name = event.get("source_alias_name")
            if alias_name is None:
                if key in declared_assets:
                    direct[key].append(extra)
                else:
                    ignored += 1
                continue
            if alias_name not in declared_aliases:
                ignored += 1
                continue
            dest_extra = event.get("dest_asset_extra") or {}
            if not isinstance(dest_extra, dict):
                raise RegistrationError(f"{at}.dest_asset_extra: must be an object")
            plan.new_asset_extra.setdefault(key, dest_extra)
            canonical = json.dumps(extra, sort_keys=True)
            emission = through_alias.get((key, canonical))
            if emission is None:
                emission = through_alias[(key, canonical)] = _Emission(index, key, extra)
            if alias_name not in emission.alias_names:
                emission.alias_names.append(alias_name)
        plan.ignored.append(ignored)

        ordinals: dict[AssetKey, int] = defaultdict(int)
        for key in declared_assets:
            for extra in direct.get(key) or [{}]:
                plan.emissions.append(_Emission(index, key, extra, ordinal=ordinals[key]))
                ordinals[key] += 1
        for emission in through_alias.values():
            emission.ordinal = ordinals[emission.key]
            ordinals[emission.key] += 1
            plan.emissions.append(emission)
        plan.emission_counts.append(len(plan.emissions) - first)
    return plan


def _resolve_assets(wanted: dict[AssetKey, dict[str, Any]]) -> dict[AssetKey, int]:
    """Asset ids by (name, uri), creating unknown assets. 1 query, 3 when some are new.

    An asset whose name (or uri) is taken by an asset with a different uri (or name) cannot be
    registered: that is a RegistrationError, not a silent merge.
    """

    def lookup() -> tuple[dict[AssetKey, int], set[str], set[str]]:
        names = {name for name, _ in wanted}
        uris = {uri for _, uri in wanted}
        found: dict[AssetKey, int] = {}
        taken_names: set[str] = set()
        taken_uris: set[str] = set()
        for asset_id, name, uri in Asset.objects.filter(
            Q(name__in=names) | Q(uri__in=uris)
        ).values_list("id", "name", "uri"):
            found[(name, uri)] = asset_id
            taken_names.add(name)
            taken_uris.add(uri)
        return found, taken_names, taken_uris

    found, taken_names, taken_uris = lookup()
    missing = [key for key in wanted if key not in found]
    if missing:
        free = [key for key in missing if key[0] not in taken_names and key[1] not in taken_uris]
        if free:
            # Sorted so two drains creating the same assets take the index locks in one order.
            Asset.objects.bulk_create(
                [
                    Asset(name=name, uri=uri, extra=wanted[(name, uri)])
                    for name, uri in in_lock_order(free)
                ],
                ignore_conflicts=True,
            )
            found, _, _ = lookup()
        for name, uri in missing:
            if (name, uri) not in found:
                conflicting = sorted(
                    (asset_id, stored_name, stored_uri)
                    for (stored_name, stored_uri), asset_id in found.items()
                    if stored_name == name or stored_uri == uri
                )
                raise RegistrationError(
                    f"asset name={name!r} uri={uri!r} conflicts with an existing asset that has "
                    "the same name or uri but not both",
                    reason="asset_key_conflict",
                    asset_key={"name": name, "uri": uri},
                    conflicting_assets=[{"id": i, "name": n, "uri": u} for i, n, u in conflicting],
                )
    return found


def _resolve_aliases(names: set[str]) -> dict[str, int]:
    """Alias ids by name, creating unknown aliases. 1 query, 3 when some are new."""

    def lookup() -> dict[str, int]:
        return dict(AssetAlias.objects.filter(name__in=names).values_list("name", "id"))

    found = lookup()
    missing = in_lock_order(names - set(found))
    if missing:
        AssetAlias.objects.bulk_create(
            [AssetAlias(name=name) for name in missing], ignore_conflicts=True
        )
        found = lookup()
    return found


def _insert_events(rows: list[tuple[Any, ...]], *, now: datetime) -> dict[EventKey, int]:
    """Insert events from (asset_id, extra JSON text, dag_id, run_id, task_id, map_index, ti_id,
    try_number, ordinal) rows, skipping those whose idempotency key exists; returns
    {idempotency key: id} for the rows actually inserted. One statement whatever the row count
    (`registration_sql.insert_events`)."""
    return registration_sql.insert_events(rows, now=now)


def _insert_queue_rows(rows: list[tuple[str, int, int]], *, now: datetime) -> int:
    """Insert ADRQ rows (target_dag_id, asset_event_id, asset_id) in the given (sorted) order,
    conflicts ignored; returns the number inserted. 1 statement
    (`registration_sql.insert_queue_rows`): the one writer of ADRQ rows, called with
    `in_lock_order` rows."""
    return registration_sql.insert_queue_rows(rows, now=now)


def _resolve_references(payloads: Sequence[OutboxPayload]) -> Sequence[OutboxPayload]:
    """Replace `AssetNameRef` / `AssetUriRef` outlets by the full key of the asset they name.

    One query, and only when some payload has such an outlet. Unknown references are dropped
    (with a warning): there is no asset to produce an event for. Payloads are not modified; the
    ones that change are shallow-copied.
    """
    wanted: dict[str, set[str]] = {"name": set(), "uri": set()}
    for payload in payloads:
        for outlet in (payload.get("outlets") or []) if isinstance(payload, dict) else []:
            field = (
                REFERENCE_TYPES.get(str(outlet.get("type"))) if isinstance(outlet, dict) else None
            )
            if field and isinstance(value := outlet.get(field), str):
                wanted[field].add(value)
    if not wanted["name"] and not wanted["uri"]:
        return payloads
    found: dict[str, dict[str, tuple[str, str]]] = {"name": {}, "uri": {}}
    for name, uri in Asset.objects.filter(
        Q(name__in=wanted["name"]) | Q(uri__in=wanted["uri"])
    ).values_list("name", "uri"):
        found["name"][name] = found["uri"][uri] = (name, uri)
    resolved = []
    for payload in payloads:
        outlets = payload.get("outlets") if isinstance(payload, dict) else None
        if not outlets or not any(
            isinstance(o, dict) and o.get("type") in REFERENCE_TYPES for o in outlets
        ):
            resolved.append(payload)
            continue
        new_outlets = []
        for outlet in outlets:
            field = (
                REFERENCE_TYPES.get(str(outlet.get("type"))) if isinstance(outlet, dict) else None
            )
            if field is None:
                new_outlets.append(outlet)
            elif isinstance(ref := outlet.get(field), str) and (key := found[field].get(ref)):
                new_outlets.append({"name": key[0], "uri": key[1], "type": "Asset"})
            else:
                logger.warning("outlet %s %r names no known asset; skipped", field, outlet)
        resolved.append({**payload, "outlets": new_outlets})
    return resolved


@dataclass
class _Tally:
    """What registering one payload has done so far; it becomes the payload's result."""

    event_ids: list[int] = field(default_factory=list)
    written: int = 0
    queued: int = 0
    dag_ids: set[str] = field(default_factory=set)


def _link_aliases(
    emissions: Sequence[_Emission],
    asset_ids: dict[AssetKey, int],
    alias_ids: dict[str, int],
    *,
    now: datetime,
) -> None:
    """The alias -> asset links the emissions came through, in lock order (one query, none
    without aliases); a link that exists already is left as it is."""
    links = in_lock_order(
        {(alias_ids[name], asset_ids[e.key]) for e in emissions for name in e.alias_names}
    )
    if links:
        AssetAliasAsset.objects.bulk_create(
            [AssetAliasAsset(alias_id=a, asset_id=s, created_at=now) for a, s in links],
            ignore_conflicts=True,
        )


def _write_events(
    plan: _Plan, asset_ids: dict[AssetKey, int], tallies: list[_Tally], *, now: datetime
) -> list[tuple[_Emission, int]]:
    """Insert the plan's events (one query; a second reads the ids of those registered before,
    on a replay) and tally each payload's; the new ones, with their ids, in emission order."""

    def key_of(e: _Emission) -> EventKey:
        source = plan.sources[e.payload_index]
        return (source["ti_id"], source["try_number"], asset_ids[e.key], e.ordinal)

    rows = []
    for e in plan.emissions:
        s = plan.sources[e.payload_index]
        rows.append(
            (
                asset_ids[e.key],
                json.dumps(e.extra) if e.extra else "{}",
                s["dag_id"],
                s["run_id"],
                s["task_id"],
                s["map_index"],
                s["ti_id"],
                s["try_number"],
                e.ordinal,
            )
        )
    inserted = _insert_events(rows, now=now)
    existing: dict[EventKey, int] = {}
    if len(inserted) < len(plan.emissions):
        # Some events were registered before (a replay): read their ids.
        ti_ids = {s["ti_id"] for s in plan.sources}
        existing = {
            (ti, tn, asset, ordinal): pk
            for pk, ti, tn, asset, ordinal in AssetEvent.objects.filter(
                source_ti_id__in=ti_ids
            ).values_list("id", "source_ti_id", "source_try_number", "asset_id", "source_ordinal")
        }

    new_emissions: list[tuple[_Emission, int]] = []
    for e in plan.emissions:
        key = key_of(e)
        tally = tallies[e.payload_index]
        if key in inserted:
            new_emissions.append((e, inserted[key]))
            tally.event_ids.append(inserted[key])
            tally.written += 1
        elif key in existing:
            tally.event_ids.append(existing[key])
        else:  # pragma: no cover - the unique constraint guarantees one or the other
            raise RegistrationError(f"event {key} neither inserted nor found")
    return new_emissions


def _record_alias_events(
    new_emissions: Sequence[tuple[_Emission, int]], alias_ids: dict[str, int]
) -> None:
    """Which aliases each new event came through (one query, none without aliases)."""
    alias_events = [
        AssetAliasEvent(alias_id=alias_ids[name], asset_event_id=event_id)
        for e, event_id in new_emissions
        for name in e.alias_names
    ]
    if alias_events:
        AssetAliasEvent.objects.bulk_create(alias_events, ignore_conflicts=True)


def _queue_for_dags(
    new_emissions: Sequence[tuple[_Emission, int]],
    asset_ids: dict[AssetKey, int],
    alias_ids: dict[str, int],
    tallies: list[_Tally],
    *,
    now: datetime,
) -> None:
    """One ADRQ row per (Dag scheduled on a new event's asset or on an alias it came through,
    event), paused Dags included, inserted in lock order (invariant 7); tallied per payload.
    Two reads (the asset and the alias references; none of the second without aliases) and
    one insert."""
    new_asset_ids = {asset_ids[e.key] for e, _ in new_emissions}
    dags_by_asset: dict[int, set[str]] = defaultdict(set)
    for asset_id, dag_id in DagScheduleAssetReference.objects.filter(
        asset_id__in=new_asset_ids
    ).values_list("asset_id", "dag_id"):
        dags_by_asset[asset_id].add(dag_id)
    dags_by_alias: dict[int, set[str]] = defaultdict(set)
    new_alias_ids = {alias_ids[n] for e, _ in new_emissions for n in e.alias_names}
    if new_alias_ids:
        for alias_id, dag_id in DagScheduleAliasReference.objects.filter(
            alias_id__in=new_alias_ids
        ).values_list("alias_id", "dag_id"):
            dags_by_alias[alias_id].add(dag_id)
    queue_rows: set[tuple[str, int, int]] = set()
    for e, event_id in new_emissions:
        asset_id = asset_ids[e.key]
        targets = set(dags_by_asset[asset_id])
        for name in e.alias_names:
            targets |= dags_by_alias[alias_ids[name]]
        tally = tallies[e.payload_index]
        for dag_id in targets:
            queue_rows.add((dag_id, event_id, asset_id))
            tally.dag_ids.add(dag_id)
        tally.queued += len(targets)
    if queue_rows:
        # Events are new, so no row can conflict; ON CONFLICT is belt and braces.
        _insert_queue_rows(in_lock_order(queue_rows), now=now)


def register_payloads(
    *,
    payloads: Sequence[OutboxPayload],
    windows: Sequence[tuple[int, int | None]] | None = None,
) -> list[RegistrationResult]:
    """Register a batch of outbox payloads; one result per payload, in order.

    Runs inside the caller's transaction; its only explicit locks are the registration fences of the
    bounded Dags it queues for (`registration_sql.announce_events`); a fixed number of queries
    whatever the batch size. Idempotent: a payload registered before writes nothing new (and no ADRQ
    rows). A malformed payload raises RegistrationError before any write; a database error leaves
    partial writes that the caller must roll back (the drain uses a savepoint). Metrics (events
    written, outlet events ignored) are counted on commit.

    `windows` (one (start, stop) per payload, stop None for "to the end") registers only those
    events of each payload, by their position in the payload's fixed emission order (each
    result's `emissions` is the payload's total): the drain registers a huge payload in chunks,
    one transaction each. Ordinals come from the whole payload, so a chunk writes the same
    events (same idempotency keys) whichever transaction registers it.
    """
    now = timezone.now()
    plan = _plan(_resolve_references(payloads))
    emission_counts = list(plan.emission_counts)
    if windows is not None:
        plan.keep_windows(windows)
    tallies = [_Tally() for _ in payloads]
    if plan.emissions:
        asset_ids = _resolve_assets(plan.new_asset_extra)
        alias_names = {name for e in plan.emissions for name in e.alias_names}
        alias_ids = _resolve_aliases(alias_names) if alias_names else {}
        _link_aliases(plan.emissions, asset_ids, alias_ids, now=now)
        # Before any event id is allocated: a bounded Dag's pass waits for these events
        # (invariant 16, `sql/fences.py`), and a late freshness policy is looked at again.
        registration_sql.announce_events(
            asset_ids=[asset_ids[e.key] for e in plan.emissions], alias_ids=alias_ids.values()
        )
        new_emissions = _write_events(plan, asset_ids, tallies, now=now)
        _record_alias_events(new_emissions, alias_ids)
        if new_emissions:
            _queue_for_dags(new_emissions, asset_ids, alias_ids, tallies, now=now)

    metrics.incr(metrics.EVENTS_WRITTEN, sum(t.written for t in tallies))
    metrics.incr(metrics.OUTLET_EVENTS_IGNORED, sum(plan.ignored))
    return [
        RegistrationResult(
            event_ids=tuple(tally.event_ids),
            events_written=tally.written,
            ignored_outlet_events=plan.ignored[i],
            queued_rows=tally.queued,
            dag_ids=frozenset(tally.dag_ids),
            emissions=emission_counts[i],
        )
        for i, tally in enumerate(tallies)
    ]


def register_payload(*, payload: OutboxPayload) -> RegistrationResult:
    """Register one outbox payload. Runs inside the caller's transaction; idempotent (see
    `register_payloads`)."""
    (result,) = register_payloads(payloads=[payload])
    return result


@dataclass(frozen=True)
class IdempotencyKey:
    """An Idempotency-Key as the service keeps it: the caller's key, who the caller is (`scope`:
    `token:<id>` or `user:<id>`; another caller's same key is another key) and the sha256 of the
    request body it came with (`body_hash`, of the body as canonical JSON)."""

    key: str
    scope: str
    body_hash: str

    @classmethod
    def of(cls, *, key: str, scope: str, body: Any) -> "IdempotencyKey":
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return cls(key=key, scope=scope, body_hash=hashlib.sha256(canonical.encode()).hexdigest())


def _insert_external_event(
    *, asset_id: int, extra: dict[str, Any], idempotency: IdempotencyKey | None, now: datetime
) -> int | None:
    """Insert an event without a source TI; None when the caller's key is taken (a retry)."""
    key, scope, body_hash = (
        (idempotency.key, idempotency.scope, idempotency.body_hash)
        if idempotency
        else (None, "", "")
    )
    return registration_sql.insert_external_event(
        asset_id=asset_id, extra=extra, key=key, scope=scope, body_hash=body_hash, now=now
    )


def _queue_external_events(events: Sequence[tuple[int, int]], *, now: datetime) -> set[str]:
    """ADRQ rows for new external events ((event id, asset id) pairs): one per (Dag scheduled on
    the event's asset, event), paused Dags included, inserted in lock order (invariant 7); the
    scheduler is nudged for those Dags after commit. Two queries (one without Dags); the Dags."""
    asset_ids = {asset_id for _, asset_id in events}
    dags_by_asset: dict[int, set[str]] = defaultdict(set)
    for asset_id, dag_id in DagScheduleAssetReference.objects.filter(
        asset_id__in=asset_ids
    ).values_list("asset_id", "dag_id"):
        dags_by_asset[asset_id].add(dag_id)
    rows = in_lock_order(
        (dag_id, event_id, asset_id)
        for event_id, asset_id in events
        for dag_id in dags_by_asset[asset_id]
    )
    dag_ids = {dag_id for dag_id, _, _ in rows}
    if rows:
        _insert_queue_rows(rows, now=now)
        nudges.scheduler_on_commit(dag_ids=sorted(dag_ids))
    return dag_ids


@dataclass(frozen=True)
class ExternalEvents:
    """The events `register_external_events` wrote (one per asset, in asset-id order) and the
    Dags it queued them for."""

    event_ids: tuple[int, ...]
    dag_ids: frozenset[str]


def register_external_events(
    *, asset_ids: Sequence[int], extra: dict[str, Any], now: datetime
) -> ExternalEvents:
    """One external event (no source TI, no idempotency key) per asset of `asset_ids`, all with
    `extra`, and their ADRQ rows, as `register_external_event` writes them (its same insert, its
    same queueing). Runs inside the caller's transaction, whose own unique row (a queue
    watcher's message row) is what makes it happen once: this function is not idempotent.
    `extra` must have passed `limits.check_json`. Counted on commit; the scheduler is nudged
    after commit."""
    written: list[tuple[int, int]] = []
    registration_sql.announce_events(asset_ids=asset_ids)  # before any event id (invariant 16)
    for asset_id in sorted(set(asset_ids)):
        event_id = _insert_external_event(asset_id=asset_id, extra=extra, idempotency=None, now=now)
        assert event_id is not None  # no key, no conflict
        written.append((event_id, asset_id))
    dag_ids = _queue_external_events(written, now=now)
    metrics.incr(metrics.EVENTS_WRITTEN, len(written))
    return ExternalEvents(
        event_ids=tuple(event_id for event_id, _ in written), dag_ids=frozenset(dag_ids)
    )


def _event_of_key(idempotency: IdempotencyKey) -> AssetEvent | None:
    return (
        AssetEvent.objects.select_related("asset")
        .filter(external_key_scope=idempotency.scope, external_key=idempotency.key)
        .first()
    )


def register_external_event(
    *,
    asset: Asset,
    extra: dict[str, Any] | None = None,
    idempotency: IdempotencyKey | None = None,
    user: Any = None,
    actor: audit.Actor | None = None,
) -> tuple[AssetEvent, bool]:
    """Register an event posted to the public API; returns (event, created).

    Its own durable transaction. `extra` gets `from_rest_api: true` (as in Airflow). With an
    `idempotency` key (the Idempotency-Key header, scoped to its caller) a retry with the same
    body returns the first event and writes nothing; the same key with another body raises
    InvalidInput `idempotency_key_reused` (HTTP 422) and writes nothing; so does an `extra`
    nested deeper than `limits.MAX_JSON_DEPTH` (`too_deep`). ADRQ rows for the
    Dags scheduled on the asset are written with the event, and the scheduler is nudged after
    commit. A created event is audited for `actor` (an
    `audit.Actor`; `user` is kept for callers that pass one), a replay is not.
    """
    if actor is None and user is not None:
        actor = audit.Actor.from_user(user, via="api")
    limits.check_json(extra or {}, field="extra", loc=("body", "extra"))

    extra = {**(extra or {}), "from_rest_api": True}
    with transaction.atomic(durable=True):
        now = timezone.now()
        registration_sql.announce_events(asset_ids=[asset.pk])  # before its event id (inv. 16)
        event_id = _insert_external_event(
            asset_id=asset.pk, extra=extra, idempotency=idempotency, now=now
        )
        if event_id is None:
            assert idempotency is not None  # only a key can conflict
            first = _event_of_key(idempotency)
            if first is None or first.request_hash != idempotency.body_hash:
                raise exceptions.InvalidInput(
                    f"Idempotency-Key {idempotency.key!r} was already used with another request "
                    "body: use a new key for another event",
                    reason="idempotency_key_reused",
                    loc=["header", "Idempotency-Key"],
                )
            return first, False
        _queue_external_events([(event_id, asset.pk)], now=now)
        metrics.incr(metrics.EVENTS_WRITTEN)
        audit.record(
            actor=actor,
            action="asset_event.create",
            summary=f"registered an external event #{event_id} of asset {asset.name}",
            targets=[audit.Target(kind="asset_event", object_id=event_id)],
            detail={"asset_id": asset.pk, "external_key": idempotency and idempotency.key},
        )
        return AssetEvent.objects.select_related("asset").get(pk=event_id), True
