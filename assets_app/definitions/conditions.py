"""The schedule condition language: parse, list references, evaluate.

A condition is an asset reference, an alias reference, or `all` / `any` over nested conditions:

    "orders"                                   asset whose name and uri are both "orders"
    {"name": "orders", "uri": "s3://b/orders"} asset (one key given: the other equals it)
    {"asset": {"name": ..., "uri": ...}}       asset, the normalized form stored on Dag.schedule
    {"alias": "cleaned"}                       every asset the alias resolves to (any of them)
    {"all": [cond, ...]}  /  {"any": [cond, ...]}

`Dag.schedule` stores `to_json(parse(raw))`, so stored schedules parse back to the same tree.
Its shape is `dag_schema.Condition` (pydantic models, published in the Dag definition JSON Schema);
`parse` validates with it and builds the frozen dataclasses below. A condition nests at most
`limits.MAX_CONDITION_DEPTH` levels (each condition one level): `parse` refuses a deeper one with a
ConditionError naming the path, before walking it, so the functions below never meet a tree deep
enough to exhaust Python's stack.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..guards.limits import UNREADABLE_KEY, UNREADABLE_MESSAGE
from . import schema as dag_schema


class ConditionError(ValueError):
    """A condition that cannot be parsed; `path` is the JSON path of the offending value."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class AssetRef:
    name: str
    uri: str


@dataclass(frozen=True)
class AliasRef:
    name: str


@dataclass(frozen=True)
class AllOf:
    children: tuple[Condition, ...]


@dataclass(frozen=True)
class AnyOf:
    children: tuple[Condition, ...]


Condition = AssetRef | AliasRef | AllOf | AnyOf


def asset_ref(model: str | dag_schema.AssetObject) -> AssetRef:
    """The asset a `dag_schema.AssetRef` validated (one key given: the other equals it)."""
    if isinstance(model, str):
        return AssetRef(name=model, uri=model)
    name, uri = model.name or model.uri, model.uri or model.name
    return AssetRef(name=name, uri=uri)


def from_model(model: Any) -> Condition:
    """The condition a `dag_schema.Condition` validated (at most MAX_CONDITION_DEPTH levels)."""
    match model:
        case dag_schema.AllCondition():
            return AllOf(tuple(from_model(child) for child in model.all))
        case dag_schema.AnyCondition():
            return AnyOf(tuple(from_model(child) for child in model.any))
        case dag_schema.AliasCondition():
            return AliasRef(name=model.alias)
        case dag_schema.AssetCondition():
            return asset_ref(model.asset)
    return asset_ref(model)


def parse(raw: Any, *, path: str = "schedule") -> Condition:
    """Parse a condition (raw or normalized form) with its schema (`dag_schema.Schedule`, which
    refuses a condition nested deeper than MAX_CONDITION_DEPTH before walking it). Raises
    ConditionError naming the JSON path, `path` being the condition's own."""
    if isinstance(raw, dict) and raw.get(UNREADABLE_KEY) == UNREADABLE_MESSAGE:
        raise ConditionError(path, UNREADABLE_MESSAGE)
    try:
        model = dag_schema.SCHEDULE.validate_python(raw)
    except ValidationError as exc:
        where, message = dag_schema.problem(exc)
        raise ConditionError(dag_schema.join(path, where), message) from None
    return from_model(model)


def to_json(condition: Condition) -> dict[str, Any]:
    """The normalized JSON form stored on `Dag.schedule`."""
    match condition:
        case AssetRef(name=name, uri=uri):
            return {"asset": {"name": name, "uri": uri}}
        case AliasRef(name=name):
            return {"alias": name}
        case AllOf(children=children):
            return {"all": [to_json(child) for child in children]}
        case AnyOf(children=children):
            return {"any": [to_json(child) for child in children]}
    raise TypeError(condition)


def _walk(condition: Condition) -> Iterator[Condition]:
    yield condition
    if isinstance(condition, AllOf | AnyOf):
        for child in condition.children:
            yield from _walk(child)


def referenced_assets(condition: Condition) -> list[AssetRef]:
    """Asset references in the condition, first occurrence order, without duplicates."""
    return list(dict.fromkeys(c for c in _walk(condition) if isinstance(c, AssetRef)))


def referenced_aliases(condition: Condition) -> list[str]:
    """Alias names in the condition, first occurrence order, without duplicates."""
    return list(dict.fromkeys(c.name for c in _walk(condition) if isinstance(c, AliasRef)))


def met_by_any_one_event(condition: Condition) -> bool:
    """Does one event of any asset the condition names (directly or through an alias) meet it
    alone? True for an asset, an alias and `any` of such; false for an `all` of two different
    members. A Dag that consumes a bounded number of events per run (`per_event`,
    `max_events`) needs it: with `all` of two assets an event alone could never be consumed."""
    # Stands for "an asset the alias resolves to"; asset names are never empty.
    linked = ""
    for leaf in _walk(condition):
        if isinstance(leaf, AssetRef):
            met = evaluate(condition, present={leaf.name})
        elif isinstance(leaf, AliasRef):
            met = evaluate(condition, present={linked}, alias_assets={leaf.name: {linked}})
        else:
            continue
        if not met:
            return False
    return True


def evaluate(
    condition: Condition,
    *,
    present: Set[str],
    alias_assets: Mapping[str, Set[str]] | None = None,
) -> bool:
    """Is the condition met when the assets named in `present` have new events?

    An alias counts as its linked assets (met when any of them is present); `alias_assets` maps
    alias name -> names of the assets it resolves to. An alias with no links is not met.
    """
    alias_assets = alias_assets or {}
    match condition:
        case AssetRef(name=name):
            return name in present
        case AliasRef(name=name):
            return not present.isdisjoint(alias_assets.get(name, ()))
        case AllOf(children=children):
            return all(evaluate(c, present=present, alias_assets=alias_assets) for c in children)
        case AnyOf(children=children):
            return any(evaluate(c, present=present, alias_assets=alias_assets) for c in children)
    raise TypeError(condition)


@dataclass(frozen=True)
class ConditionStatus:
    """A condition node with whether it is met; `children` mirror `all`/`any` children."""

    condition: Condition
    met: bool
    children: tuple[ConditionStatus, ...] = ()


def explain(
    condition: Condition,
    *,
    present: Set[str],
    alias_assets: Mapping[str, Set[str]] | None = None,
) -> ConditionStatus:
    """`evaluate`, keeping the verdict of every node (for showing which parts are satisfied)."""
    alias_assets = alias_assets or {}
    if isinstance(condition, AllOf | AnyOf):
        children = tuple(
            explain(c, present=present, alias_assets=alias_assets) for c in condition.children
        )
        combine = all if isinstance(condition, AllOf) else any
        return ConditionStatus(condition, combine(c.met for c in children), children)
    return ConditionStatus(
        condition, evaluate(condition, present=present, alias_assets=alias_assets)
    )
