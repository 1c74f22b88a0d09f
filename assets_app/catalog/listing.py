"""Airflow-style list queries for the public API v2: `order_by` lists, `*_pattern` and
`*_prefix_pattern` filters, ranges, offset pages and cursor (keyset) pages, on Django querysets.

The semantics are those of Airflow 3.3.2's public API (its `common/parameters.py` and
`cursors.py`), so a script written against Airflow gets the same rows here:
- `order_by`: up to 10 names, `-` for descending; a name the endpoint does not offer is a 400
  (`invalid_order_by`) naming it. The primary key is appended as the last key (descending when the
  first key is), so every order is total and pages never overlap. NULLs sort as PostgreSQL sorts
  them (last ascending, first descending) on every database.
- `*_pattern`: case-insensitive substring match in which `%` and `_` are wildcards; `|` separates
  alternatives; `~` alone matches everything.
- `*_prefix_pattern`: case-sensitive prefix match, `%` and `_` literal; `|` and `~` as above.
  (Airflow also drops trailing punctuation from the prefix so its range scan suits locale
  collations; here the prefix is matched exactly, with the column's `LIKE` index.)
- `limit` >= 0 (0: an empty page with the total), clamped to `MAXIMUM_PAGE_LIMIT` as Airflow clamps
  to `[api] maximum_page_limit`; `offset` >= 0.
- `cursor`: "" for the first page, then a page's `next_cursor` / `previous_cursor`; the offset is
  then ignored and the total counts at most `EXACT_COUNT_LIMIT` rows (`total_entries_limit`).

Every function here only builds querysets or runs the two or three reads of one page; nothing
writes or locks. Endpoints declare what they offer (an `Ordering`), domain modules apply it.
"""

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Expression, F, Lookup, Q, QuerySet
from django.db.models.fields import Field

from ..guards import exceptions
from ..sql import connection as connection_sql

MAXIMUM_PAGE_LIMIT = 100
DEFAULT_PAGE_LIMIT = 50
MAX_ORDER_BY = 10
# Airflow's EXACT_COUNT_LIMIT: a cursor page counts its rows up to this many.
EXACT_COUNT_LIMIT = 50_000


def as_utc(value: datetime | None, *, field: str) -> datetime | None:
    """An aware datetime filter value converted to UTC. PostgreSQL refuses offsets beyond
    +-15:59 (a 500 if passed through); a value that leaves the datetime range once in UTC is
    InvalidInput."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise exceptions.InvalidInput(f"{field} needs a time zone", reason="invalid_datetime")
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise exceptions.InvalidInput(
            f"{field} is out of range once converted to UTC", reason="invalid_datetime"
        ) from exc


@Field.register_lookup
class AirflowLike(Lookup):
    """`column ILIKE pattern` with the caller's `%` / `_` wildcards (SQLite: LIKE, which is
    case-insensitive for ASCII). Django's `icontains` would escape them."""

    lookup_name = "airflow_ilike"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        operator = connection_sql.ilike_operator(connection)
        return f"{lhs} {operator} {rhs}", [*lhs_params, *rhs_params]


def page_limit(limit: int) -> int:
    return min(limit, MAXIMUM_PAGE_LIMIT)


def _terms(value: str) -> list[str]:
    if "|" in value:
        terms = [term.strip() for term in value.split("|") if term.strip()]
        if terms:
            return terms
    return [value]


def pattern_q(field: str, value: str | None) -> Q:
    """A `*_pattern` filter on `field` (see the module docstring); no value: no filter."""
    if value is None:
        return Q()
    value = "%" if value == "~" else value
    q = Q()
    for term in _terms(value):
        q |= Q(**{f"{field}__airflow_ilike": f"%{term}%"})
    return q


def prefix_q(field: str, value: str | None) -> Q:
    """A `*_prefix_pattern` filter on `field`; no value: no filter."""
    if value is None:
        return Q()
    value = "" if value == "~" else value
    q = Q()
    for term in _terms(value):
        q |= Q(**{f"{field}__startswith": term}) if term else Q(**{f"{field}__isnull": False})
    return q


def _like_regex(term: str) -> str:
    return "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in term)


def matches(value: str, *, pattern: str | None = None, prefix: str | None = None) -> bool:
    """`pattern_q` and `prefix_q` on one value in Python, for the few lists not read from a
    column (a Dag's tags are a JSON list): the same wildcards, alternatives and `~`."""
    if pattern is not None:
        terms = _terms("%" if pattern == "~" else pattern)
        regexes = [re.compile(f".*{_like_regex(t)}.*", re.IGNORECASE | re.DOTALL) for t in terms]
        if not any(r.fullmatch(value) for r in regexes):
            return False
    return prefix is None or any(
        value.startswith(t) for t in _terms("" if prefix == "~" else prefix)
    )


def range_q(
    field: str,
    *,
    gte: Any = None,
    gt: Any = None,
    lte: Any = None,
    lt: Any = None,
    param: str | None = None,
) -> Q:
    """Airflow's `<param>_gte/_gt/_lte/_lt` range on `field`; datetimes are checked and converted
    to UTC (`as_utc`)."""
    name = param or field
    q = Q()
    for suffix, value in (("gte", gte), ("gt", gt), ("lte", lte), ("lt", lt)):
        if value is None:
            continue
        if isinstance(value, datetime):
            value = as_utc(value, field=f"{name}_{suffix}")
        q &= Q(**{f"{field}__{suffix}": value})
    return q


def constant_q(value: Any, accepted: Sequence[Any] | None) -> Q:
    """A filter on a field every row has the same `value` of (Airflow's `pool` is always
    "default_pool" here): no filter when nothing is asked or the value is accepted, else no row."""
    if not accepted or value in accepted:
        return Q()
    return Q(pk__in=[])


# --- ordering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ordering:
    """What an endpoint may be ordered by: public name -> ORM field path or expression, the
    default `order_by`, and the primary key appended as the last key."""

    keys: Mapping[str, str | Expression]
    default: Sequence[str]
    pk: str = "id"

    def names(self) -> str:
        return ", ".join(self.keys)


@dataclass(frozen=True)
class _Key:
    alias: str  # the annotation holding the key's value on each row
    descending: bool


def resolve_order(
    ordering: Ordering, order_by: Sequence[str] | None
) -> tuple[dict[str, Any], list[_Key]]:
    """The annotations and keys for `order_by` (the endpoint's default when empty). BadRequest
    (400, `invalid_order_by`) for more than 10 names or a name the endpoint does not offer."""
    values = [value for value in (order_by or ()) if value] or list(ordering.default)
    if len(values) > MAX_ORDER_BY:
        raise exceptions.BadRequest(
            f"Ordering with more than {MAX_ORDER_BY} parameters is not allowed. Provided: {values}",
            reason="invalid_order_by",
        )
    annotations: dict[str, Any] = {}
    keys: list[_Key] = []
    for value in values:
        name = value.lstrip("-")
        if name not in ordering.keys:
            raise exceptions.BadRequest(
                f"Ordering with '{name}' is disallowed or the attribute does not exist on the "
                f"model; order_by accepts: {ordering.names()}",
                reason="invalid_order_by",
                field=name,
            )
        target = ordering.keys[name]
        alias = f"_order_{len(keys)}"
        annotations[alias] = F(target) if isinstance(target, str) else target
        keys.append(_Key(alias=alias, descending=value.startswith("-")))
    if not any(ordering.keys.get(v.lstrip("-")) == ordering.pk for v in values):
        alias = f"_order_{len(keys)}"
        annotations[alias] = F(ordering.pk)
        keys.append(_Key(alias=alias, descending=values[0].startswith("-")))
    return annotations, keys


def _order_expressions(keys: Sequence[_Key], *, reverse: bool = False) -> list[Any]:
    expressions = []
    for key in keys:
        descending = key.descending != reverse
        expressions.append(
            F(key.alias).desc(nulls_first=True) if descending else F(key.alias).asc(nulls_last=True)
        )
    return expressions


def ordered(queryset: QuerySet, ordering: Ordering, order_by: Sequence[str] | None) -> QuerySet:
    annotations, keys = resolve_order(ordering, order_by)
    return queryset.annotate(**annotations).order_by(*_order_expressions(keys))


# --- pages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    total_entries: int
    total_entries_limit: int | None = None
    next_cursor: str | None = None
    previous_cursor: str | None = None


def sorted_page(
    values: Sequence[Any],
    *,
    order_by: Sequence[str] | None,
    names: Sequence[str],
    limit: int,
    offset: int,
) -> Page:
    """One page of values already in memory, ordered by themselves: `order_by` may name one of
    `names` (`-` for descending; another name is the 400 `invalid_order_by`, as for a query)."""
    ordering = Ordering(keys={name: name for name in names}, default=(names[0],), pk=names[0])
    resolve_order(ordering, order_by)
    descending = next((o for o in order_by or () if o), "").startswith("-")
    rows = sorted(values, reverse=descending)
    limit = page_limit(limit)
    return Page(rows=rows[offset : offset + limit] if limit else [], total_entries=len(rows))


# Offset pages from here on load their keys first, then their rows (`offset_page`).
DEFERRED_JOIN_FROM = 1_000


def offset_page(
    queryset: QuerySet,
    ordering: Ordering,
    *,
    order_by: Sequence[str] | None,
    limit: int,
    offset: int,
) -> Page:
    """One page by offset: two queries (count, page) plus the queryset's prefetches; from
    offset DEFERRED_JOIN_FROM on, three (count, the page's keys, its rows).

    Deep pages (issue 48) pick the page's primary keys first, reading only the order's columns
    (an index-only scan where an index serves the order), then load those rows whole: the
    skipped rows are never fetched from the table, nor joined for their select_related. Same
    rows in the same order as the one-query page."""
    sorted_rows = ordered(queryset, ordering, order_by)
    total = queryset.order_by().count()
    limit = page_limit(limit)
    if not limit:
        return Page(rows=[], total_entries=total)
    if offset < DEFERRED_JOIN_FROM:
        return Page(rows=list(sorted_rows[offset : offset + limit]), total_entries=total)
    keys = list(
        sorted_rows.prefetch_related(None).values_list("pk", flat=True)[offset : offset + limit]
    )
    return Page(rows=list(sorted_rows.filter(pk__in=keys)), total_entries=total)


_BACKWARD = "~"


def _encode(values: list[Any]) -> str:
    def plain(value: Any) -> Any:
        if isinstance(value, datetime):
            return {"dt": value.isoformat()}
        if isinstance(value, timedelta):
            return {"td": value.total_seconds()}
        if isinstance(value, UUID):
            return str(value)
        return value

    raw = json.dumps([plain(v) for v in values], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode(token: str, count: int) -> list[Any]:
    def typed(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"dt"}:
            return datetime.fromisoformat(value["dt"])
        if isinstance(value, dict) and set(value) == {"td"}:
            return timedelta(seconds=value["td"])
        return value

    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        values = json.loads(raw)
        if not isinstance(values, list) or len(values) != count:
            raise ValueError("the cursor does not match this query's order_by")
        return [typed(v) for v in values]
    except (ValueError, TypeError, binascii.Error) as exc:
        raise exceptions.BadRequest(
            "Invalid cursor token: pass an empty cursor for the first page, then the "
            "next_cursor or previous_cursor of the page before",
            reason="invalid_cursor",
        ) from exc


def _bounds(key: _Key, value: Any, descending: bool) -> tuple[Q, Q]:
    """(non-strict, strict) "at or after the cursor value" conditions for one key, with NULLs
    last ascending and first descending."""
    alias = key.alias
    if value is None:
        if not descending:  # NULLs are last: only NULLs are at or after a NULL
            return Q(**{f"{alias}__isnull": True}), Q(pk__in=[])
        return Q(), Q(**{f"{alias}__isnull": False})
    if descending:
        return Q(**{f"{alias}__lte": value}), Q(**{f"{alias}__lt": value})
    is_null = Q(**{f"{alias}__isnull": True})
    return Q(**{f"{alias}__gte": value}) | is_null, Q(**{f"{alias}__gt": value}) | is_null


def _after(keys: Sequence[_Key], values: Sequence[Any], *, backward: bool) -> Q:
    descending = [key.descending != backward for key in keys]
    _, inner = _bounds(keys[-1], values[-1], descending[-1])
    for i in range(len(keys) - 2, -1, -1):
        non_strict, strict = _bounds(keys[i], values[i], descending[i])
        inner = non_strict & (strict | inner)
    return inner


def cursor_page(
    queryset: QuerySet,
    ordering: Ordering,
    *,
    order_by: Sequence[str] | None,
    limit: int,
    cursor: str,
) -> Page:
    """One page by cursor (keyset): the page (one row more than asked, to know whether another
    follows) and a count bounded by EXACT_COUNT_LIMIT, plus the queryset's prefetches."""
    annotations, keys = resolve_order(ordering, order_by)
    limit = page_limit(limit)
    backward = cursor.startswith(_BACKWARD)
    token = cursor[len(_BACKWARD) :] if backward else cursor
    page = queryset.annotate(**annotations).order_by(*_order_expressions(keys, reverse=backward))
    if token:
        page = page.filter(_after(keys, _decode(token, len(keys)), backward=backward))
    fetched = list(page[: limit + 1]) if limit else []
    more = len(fetched) > limit
    rows = fetched[:limit]
    if backward:
        rows.reverse()
    has_next, has_previous = (True, more) if backward else (more, bool(token))
    total = queryset.order_by()[:EXACT_COUNT_LIMIT].count()

    def boundary(row: Any) -> str:
        return _encode([getattr(row, key.alias) for key in keys])

    return Page(
        rows=rows,
        total_entries=total,
        total_entries_limit=EXACT_COUNT_LIMIT,
        next_cursor=boundary(rows[-1]) if has_next and rows else None,
        previous_cursor=_BACKWARD + boundary(rows[0]) if has_previous and rows else None,
    )


def page_of(
    queryset: QuerySet,
    ordering: Ordering,
    *,
    order_by: Sequence[str] | None,
    limit: int,
    offset: int,
    cursor: str | None = None,
) -> Page:
    """`cursor_page` when a cursor is given (even ""), else `offset_page`."""
    if cursor is not None:
        return cursor_page(queryset, ordering, order_by=order_by, limit=limit, cursor=cursor)
    return offset_page(queryset, ordering, order_by=order_by, limit=limit, offset=offset)
