"""JSON in and out. `JsonParser`, the body parser of both APIs: JSON as RFC 8259 defines it, in
UTF-8, holding only what PostgreSQL's jsonb can store.

Python's json module also accepts `NaN`, `Infinity` and `-Infinity`, turns `1e400` into an
infinite float, and decodes a lone UTF-16 surrogate escape (`"\\ud800"`) into a string no UTF-8
encoder accepts. Passed through, each ended as a DataError (500) when written to a jsonb column.
Here the first three are invalid JSON (400 `invalid_json`, like any parse error) and a lone
surrogate is a 422 `invalid_characters`, like a NUL (see `api/middleware.py`). Still one parse per
request; the surrogate check re-encodes the parsed body only when it holds a `\\ud...` escape.

First orjson tries the body (a 300-outlet success: 0.14 -> ~0.04 ms of CPU). It refuses all of
the above (NaN, infinities, lone surrogates, a BOM, more than 1,024 levels) and anything else
invalid, and then the strict parse below decides, so every refusal keeps its status, reason
and message. What orjson reads differently is kept from it: an integer beyond 64 bits becomes
a float there, so a body with a run of 19 or more digits goes to the strict parse. Between
~1,000 levels (Python's RecursionError) and orjson's 1,024 a body parses where it did not, and
is then refused by the depth rule (`limits`, 422 `too_deep`) with the field's path.

A parsed body is checked against the width and size limits (`limits.check_body_width`: keys per
object, list items, string length, values in all) before any schema copies it, so a
400,000-key conf is a 422 naming `body.conf` at once.

`FullPrecisionRenderer` renders the public API's responses: datetimes with their microseconds
(Django's encoder keeps milliseconds only), so a timestamp read from one answer and passed back as
a `timestamp_lte` filter still matches the row it came from, as with Airflow's pydantic output.
"""

import json
import math
import re
from datetime import datetime
from typing import Any

import orjson
from django.http import HttpRequest
from ninja.parser import Parser
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

from assets_app.guards import exceptions, limits


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _has_lone_surrogate(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# A run of digits that may be an integer beyond 64 bits (orjson would read it as a float).
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


class JsonParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        body = request.body
        if not _LONG_DIGITS.search(body):
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                pass  # the strict parse names the problem, or reads what orjson does not
            else:
                limits.check_body_width(data, size=len(body))
                return data
        data = self.parse_strictly(body)
        limits.check_body_width(data, size=len(body))
        return data

    def parse_strictly(self, body: bytes) -> Any:
        # Strict UTF-8 (a leading BOM tolerated, as json.loads does): no raw surrogate bytes.
        text = body.decode("utf-8-sig")
        try:
            data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except RecursionError:
            path = limits.document_too_deep(text) or ""
            raise exceptions.InvalidInput(
                f"body{limits.abbreviate(path)}: JSON nests deeper than Python can parse "
                f"(fields may nest {limits.MAX_JSON_DEPTH} levels)",
                reason="too_deep",
                loc=["body"],
            ) from None
        if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(data):
            raise exceptions.InvalidInput(
                "JSON strings must not contain a lone UTF-16 surrogate (\\ud800-\\udfff)",
                reason="invalid_characters",
            )
        return data


class _FullPrecisionEncoder(NinjaJSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, datetime):
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return super().default(o)


class FullPrecisionRenderer(JSONRenderer):
    encoder_class = _FullPrecisionEncoder
