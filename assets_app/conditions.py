"""The schedule condition language: parse, list references, evaluate.

A condition is an asset reference, an alias reference, or `all` / `any` over nested conditions:

    "orders"                                   asset whose name and uri are both "orders"
    {"name": "orders", "uri": "s3://b/orders"} asset (one key given: the other equals it)
    {"asset": {"name": ..., "uri": ...}}       asset, the normalized form stored on Dag.schedule
    {"alias": "cleaned"}                       every asset the alias resolves to (any of them)
    {"all": [cond, ...]}  /  {"any": [cond, ...]}

`Dag.schedule` stores `to_json(parse(raw))`, so stored schedules parse back to the same tree.
A condition nests at most `limits.MAX_CONDITION_DEPTH` levels (each condition one level): `parse`
refuses a deeper one with a ConditionError naming the path, before recursing any further, so the
functions below never meet a tree deep enough to exhaust Python's stack.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

from .limits import MAX_CONDITION_DEPTH, UNREADABLE_KEY, UNREADABLE_MESSAGE
from .models.assets import ASSET_KEY_MAX_LENGTH


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


def _key(value: Any, path: str, what: str) -> str:
    if not isinstance(value, str):
        raise ConditionError(path, f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ConditionError(path, f"{what} must not be empty")
    if len(value) > ASSET_KEY_MAX_LENGTH:
        raise ConditionError(path, f"{what} is longer than {ASSET_KEY_MAX_LENGTH} characters")
    return value


def parse_asset_ref(raw: Any, *, path: str) -> AssetRef:
    """Parse `"name"` or `{"name", "uri"}` (one of them given: the other equals it)."""
    if isinstance(raw, str):
        name = _key(raw, path, "asset reference")
        return AssetRef(name=name, uri=name)
    if not isinstance(raw, dict):
        raise ConditionError(
            path, f"asset reference must be a string or an object, got {type(raw).__name__}"
        )
    unknown = sorted(set(raw) - {"name", "uri"})
    if unknown:
        raise ConditionError(f"{path}.{unknown[0]}", "unknown key in asset reference")
    if "name" not in raw and "uri" not in raw:
        raise ConditionError(path, "asset reference needs a name or a uri")
    name = _key(raw["name"], f"{path}.name", "name") if "name" in raw else ""
    uri = _key(raw["uri"], f"{path}.uri", "uri") if "uri" in raw else ""
    return AssetRef(name=name or uri, uri=uri or name)


def parse(raw: Any, *, path: str = "schedule", depth: int = 1) -> Condition:
    """Parse a condition (raw or normalized form). Raises ConditionError naming the JSON path,
    also for a condition nested deeper than MAX_CONDITION_DEPTH (`depth` is this node's level)."""
    if depth > MAX_CONDITION_DEPTH:
        raise ConditionError(
            path, f"conditions nest deeper than the {MAX_CONDITION_DEPTH} levels allowed"
        )
    if isinstance(raw, str):
        return parse_asset_ref(raw, path=path)
    if not isinstance(raw, dict):
        raise ConditionError(
            path, f"condition must be a string or an object, got {type(raw).__name__}"
        )
    if not raw:
        raise ConditionError(path, "condition must not be empty")
    if raw.get(UNREADABLE_KEY) == UNREADABLE_MESSAGE:
        raise ConditionError(path, UNREADABLE_MESSAGE)
    keys = set(raw)
    if keys & {"all", "any"}:
        if len(keys) != 1:
            raise ConditionError(path, f"'all'/'any' must be the only key, got {sorted(keys)}")
        (operator,) = keys
        items = raw[operator]
        if not isinstance(items, list):
            raise ConditionError(f"{path}.{operator}", "must be a list of conditions")
        if not items:
            raise ConditionError(f"{path}.{operator}", "must not be empty")
        children = tuple(
            parse(item, path=f"{path}.{operator}[{i}]", depth=depth + 1)
            for i, item in enumerate(items)
        )
        return AllOf(children) if operator == "all" else AnyOf(children)
    if "alias" in keys:
        if len(keys) != 1:
            raise ConditionError(path, f"'alias' must be the only key, got {sorted(keys)}")
        return AliasRef(name=_key(raw["alias"], f"{path}.alias", "alias name"))
    if "asset" in keys:
        if len(keys) != 1:
            raise ConditionError(path, f"'asset' must be the only key, got {sorted(keys)}")
        return parse_asset_ref(raw["asset"], path=f"{path}.asset")
    if keys <= {"name", "uri"}:
        return parse_asset_ref(raw, path=path)
    unknown = sorted(keys - {"name", "uri"})[0]
    raise ConditionError(
        f"{path}.{unknown}",
        f"unknown condition operator {unknown!r} (expected all, any, alias, asset, name, uri)",
    )


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
