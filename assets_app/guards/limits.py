"""Input bounds: one rule each, in one place, applied at every door (invariant 13).

- `MAX_JSON_DEPTH` (64): how deep a JSON value a caller gives us may nest (an event's `extra`,
  an alias event's `dest_asset_extra`, an asset's `extra`, a run's `conf`), counting the value
  itself as level 1: `{"a": {"b": 1}}` is 2 levels. Checked by the worker API, the public API
  and the DAG definitions alike (`check_json_depth`).
- `MAX_CONDITION_DEPTH` (32): how deep a schedule condition may nest, counting each condition
  (asset, alias, `all`, `any`) as one level: `{"all": ["a", "b"]}` is 2 levels. Checked by
  `condition_too_deep` in the schedule's schema (`dag_schema.Schedule`, which `conditions.parse`
  uses too), so every door that parses a schedule (definitions, `sync_dags`, the
  scheduler reading a stored one) refuses the same trees.
- `MAX_DOCUMENT_DEPTH` (512): a request body or definition file too deep for Python's JSON
  parser (a RecursionError around 1,000 levels) is refused with the JSON path where it passes
  512 levels, found by `document_too_deep` without recursion. Anything shallower is parsed and
  then meets the two rules above, which name the exact field and path.

Every check here walks the value iteratively, so a value nested 100,000 levels is refused with a
message rather than a RecursionError. What was stored before a limit existed is shown, not
re-validated: `display_json` renders JSON up to `MAX_DISPLAY_DEPTH` (128: twice the input limit,
so whatever the rules accept shows in full, also inside an outbox payload around it) and a
deeper value as a note, so the page still renders.

Strings longer than their column (`check_lengths`) are a 422 `too_long` naming the field, checked
by the domain function before it writes (XCom addresses, Variable keys, Connection fields), never
a database error.

Width and size (issue 26), beside the depth: a JSON value may hold at most `MAX_JSON_KEYS`
(10,000) keys in one object, `MAX_JSON_ITEMS` (100,000) items in one list, `MAX_JSON_STRING`
(1,000,000) characters in one string or key, and `MAX_JSON_VALUES` (1,000,000) values in all.
Real Airflow payloads stay far below (a conf or an event extra holds tens of keys; an XCom list
of 100,000 file names fits); what they stop is a body built to hold a web worker (a
400,000-key conf took ~20 s to store and echo; now a 422 in well under a second). Each is a 422
naming the field and the JSON path where the limit is passed (`too_wide`, `too_long`,
`too_large`), checked twice: by `check_json` in the domain functions (run conf, event extras,
XCom values, so every door), and first on every API body by the JSON parser (`body_too_wide`,
before the schema's validation copies it), for a body big enough to pass one (a small body
cannot, so the hot success path does not pay for the walk).
"""

import json
import re
from collections.abc import Iterable
from typing import Any

from django.db.models import Model

from . import exceptions

MAX_JSON_DEPTH = 64
MAX_JSON_KEYS = 10_000
MAX_JSON_ITEMS = 100_000
MAX_JSON_STRING = 1_000_000
MAX_JSON_VALUES = 1_000_000
# The shortest JSON text that can pass a width limit: 10,001 distinct keys of an object take at
# least 4 bytes each (`"":0` is the one key of length 0; `,"k":0` grows), 100,001 list items 2
# (`0,`), a longer string 1,000,001; a smaller body is not walked.
MIN_WIDE_BODY_BYTES = 4 * MAX_JSON_KEYS
MAX_CONDITION_DEPTH = 32
MAX_DOCUMENT_DEPTH = 512
MAX_DISPLAY_DEPTH = 128
# A Dag's `max_events` (issue 28): above it, runs are as good as `batch` (a pass locks every
# queued row of the Dag anyway) and the column stays far inside its integer type.
MAX_EVENTS_PER_RUN = 1_000_000

_STRUCTURAL = re.compile(r'["{}\[\],]')


def _segment(key: Any) -> str:
    return f"[{key}]" if isinstance(key, int) else f".{key}"


def too_deep_path(value: Any, *, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The JSON path (relative, e.g. `.a[0].b`) of the first container nested deeper than
    `limit` levels in `value`, or None when `value` is within the limit."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        items: Iterable[tuple[Any, Any]]
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if depth > limit:
            return path
        for key, child in items:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, path + _segment(key)))
    return None


def condition_too_deep(condition: Any, *, limit: int = MAX_CONDITION_DEPTH) -> str | None:
    """The JSON path (relative, e.g. `.all[0].any[1]`) of the first schedule condition nested
    deeper than `limit` levels in `condition` (each condition one level), or None."""
    stack: list[tuple[Any, int, str]] = [(condition, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return path
        if isinstance(node, dict):
            for operator in ("any", "all"):  # popped in document order: all, then any
                items = node.get(operator)
                if isinstance(items, list):
                    stack.extend(
                        (item, depth + 1, f"{path}.{operator}[{i}]")
                        for i, item in reversed(list(enumerate(items)))
                    )
    return None


def depth_message(*, limit: int, what: str = "JSON") -> str:
    return f"{what} nests deeper than the {limit} levels allowed"


def check_json_depth(
    value: Any, *, field: str, loc: tuple[str | int, ...] = (), limit: int = MAX_JSON_DEPTH
) -> None:
    """Raise InvalidInput (`too_deep`, HTTP 422) naming `field` and the path where `value`
    nests deeper than `limit`; `loc` is where the field is in a request (default: `field`)."""
    path = too_deep_path(value, limit=limit)
    if path is not None:
        raise exceptions.InvalidInput(
            f"{field}{abbreviate(path)}: {depth_message(limit=limit)}",
            reason="too_deep",
            loc=list(loc or (field,)),
            max_depth=limit,
        )


def too_wide(value: Any) -> tuple[str, str, str, int] | None:
    """The first width or size limit `value` passes, as (JSON path relative to it, reason,
    message, limit), or None. Iterative, stops at the first violation; costs one visit per
    value up to there."""
    stack: list[tuple[Any, str]] = [(value, "")]
    seen = 0
    while stack:
        node, path = stack.pop()
        seen += 1
        if seen > MAX_JSON_VALUES:
            message = f"holds more than the {MAX_JSON_VALUES:,} values allowed in all"
            return path, "too_large", message, MAX_JSON_VALUES
        if isinstance(node, str):
            if len(node) > MAX_JSON_STRING:
                message = (
                    f"a string of {len(node):,} characters; at most {MAX_JSON_STRING:,} allowed"
                )
                return path, "too_long", message, MAX_JSON_STRING
        elif isinstance(node, dict):
            if len(node) > MAX_JSON_KEYS:
                message = f"an object of {len(node):,} keys; at most {MAX_JSON_KEYS:,} allowed"
                return path, "too_wide", message, MAX_JSON_KEYS
            for key, child in node.items():
                if isinstance(key, str) and len(key) > MAX_JSON_STRING:
                    message = (
                        f"a key of {len(key):,} characters; at most {MAX_JSON_STRING:,} allowed"
                    )
                    return path, "too_long", message, MAX_JSON_STRING
                if isinstance(child, dict | list | str):
                    stack.append((child, path + _segment(key)))
                else:
                    seen += 1
        elif isinstance(node, list):
            if len(node) > MAX_JSON_ITEMS:
                message = f"a list of {len(node):,} items; at most {MAX_JSON_ITEMS:,} allowed"
                return path, "too_wide", message, MAX_JSON_ITEMS
            for index, child in enumerate(node):
                if isinstance(child, dict | list | str):
                    stack.append((child, f"{path}[{index}]"))
                else:
                    seen += 1
    return None


def _width_error(field: str, loc: tuple[str | int, ...], found: tuple[str, str, str, int]):
    path, reason, message, limit = found
    return exceptions.InvalidInput(
        f"{field}{abbreviate(path)}: {message}",
        reason=reason,
        loc=[*(loc or (field,)), *_path_parts(path)],
        limit=limit,
    )


def _path_parts(path: str) -> list[str | int]:
    """`.a[0].b` -> ["a", 0, "b"] (for a 422's `loc`; keys holding `.` or `[` read loosely)."""
    parts: list[str | int] = []
    for name, index in re.findall(r"\.([^.\[]*)|\[(\d+)\]", path):
        parts.append(int(index) if index else name)
    return parts


def check_json(
    value: Any, *, field: str, loc: tuple[str | int, ...] = (), limit: int = MAX_JSON_DEPTH
) -> None:
    """Every rule for a JSON value a caller gives us: its depth (`check_json_depth`) and its
    width and size (`too_wide`); InvalidInput (HTTP 422) naming `field` and the path."""
    check_json_depth(value, field=field, loc=loc, limit=limit)
    found = too_wide(value)
    if found is not None:
        raise _width_error(field, loc, found)


def check_body_width(data: Any, *, size: int) -> None:
    """The parser's check of a whole request body (`size` bytes), before any schema copies it:
    InvalidInput naming the path from `body` when it passes a width or size limit. A body
    smaller than `MIN_WIDE_BODY_BYTES` cannot, and is not walked."""
    if size < MIN_WIDE_BODY_BYTES:
        return
    found = too_wide(data)
    if found is not None:
        raise _width_error("body", ("body",), found)


def check_lengths(
    model: type[Model], values: dict[str, Any], *, loc: tuple[str | int, ...] = ()
) -> None:
    """Raise InvalidInput (`too_long`, HTTP 422) naming the first string of `values` (by field
    name of `model`) longer than its column's `max_length`, before a write would fail in the
    database; fields without a max length (text, JSON) and non-strings are not checked here."""
    for name, value in values.items():
        if not isinstance(value, str):
            continue
        max_length = getattr(model._meta.get_field(name), "max_length", None)
        if max_length is not None and len(value) > max_length:
            raise exceptions.InvalidInput(
                f"{name} is {len(value)} characters long; at most {max_length} are stored",
                reason="too_long",
                loc=[*loc, name],
                max_length=max_length,
            )


def document_too_deep(text: str, *, limit: int = MAX_DOCUMENT_DEPTH) -> str | None:
    """The JSON path (e.g. `[0].schedule.all[0]`) where the JSON text `text` opens a container
    deeper than `limit` levels, or None. A scan of the text, without parsing or recursion; only
    strings are decoded, to name object keys. For malformed text the answer is a best effort."""
    # Each frame: [is_object, key or index, expecting a key].
    frames: list[list[Any]] = []
    position = 0
    while (found := _STRUCTURAL.search(text, position)) is not None:
        position = found.start()
        char = text[position]
        if char == '"':
            end = position + 1
            while True:
                end = text.find('"', end)
                if end == -1:
                    return None
                backslashes = 0
                while text[end - 1 - backslashes] == "\\":
                    backslashes += 1
                if backslashes % 2 == 0:
                    break
                end += 1
            if frames and frames[-1][0] and frames[-1][2]:
                try:
                    frames[-1][1] = json.loads(text[position : end + 1])
                except ValueError:
                    frames[-1][1] = text[position + 1 : end]
                frames[-1][2] = False
            position = end + 1
            continue
        if char in "{[":
            if len(frames) >= limit:
                return "".join(_segment(frame[1]) for frame in frames)
            frames.append([char == "{", None if char == "{" else 0, char == "{"])
        elif char in "}]":
            if frames:
                frames.pop()
        elif char == "," and frames:
            if frames[-1][0]:
                frames[-1][2] = True
            else:
                frames[-1][1] += 1
        position += 1
    return None


# What `StoredJsonDecoder` reads a value too deep for Python's parser as.
UNREADABLE_KEY = "unreadable"
UNREADABLE_MESSAGE = "stored JSON nests too deep for Python's parser; not loaded"


class StoredJsonDecoder(json.JSONDecoder):
    """The decoder of the JSON columns callers fill (events' and assets' `extra`, a run's
    `conf`, a Dag's `schedule`): a value stored before the limits existed that is too deep for
    Python's parser (a RecursionError, ~1,000 levels less the caller's stack) reads as
    `{UNREADABLE_KEY: UNREADABLE_MESSAGE}`, so the page or answer showing it still works."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().decode(s, *args, **kwargs)
        except RecursionError:
            return {UNREADABLE_KEY: UNREADABLE_MESSAGE}


def abbreviate(path: str, *, keep: int = 160) -> str:
    """A JSON path short enough for a message: its start and end around an ellipsis."""
    if len(path) <= keep:
        return path
    return f"{path[: keep * 2 // 3]}…{path[-(keep // 3) :]}"


def display_json(value: Any, *, indent: int | None = 2, **dumps: Any) -> str:
    """`value` as JSON text for a page (keys sorted); a value stored nested deeper than
    MAX_DISPLAY_DEPTH becomes a note, so the page still renders."""
    path = too_deep_path(value, limit=MAX_DISPLAY_DEPTH)
    if path is not None:
        return (
            f"(not shown: nests deeper than the {MAX_DISPLAY_DEPTH} levels a page shows, "
            f"at {abbreviate(path)})"
        )
    return json.dumps(value, indent=indent, sort_keys=True, **dumps)
