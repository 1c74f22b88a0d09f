"""`JsonParser` reads a body with orjson first and falls back to the strict stdlib parse: both
must give the same value, or the same refusal, for every body (parser.py's docstring)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ninja.errors import HttpError

from assets_app.api.parser import JsonParser
from assets_app.guards import exceptions


class _Request:
    def __init__(self, body: bytes) -> None:
        self.body = body


PARSER = JsonParser()


def _outcome(parse, body: bytes):
    try:
        return ("ok", repr(parse(body)))
    except exceptions.InvalidInput as exc:
        return ("invalid", exc.reason, str(exc))
    except (ValueError, HttpError) as exc:  # JSONDecodeError and UnicodeDecodeError
        return ("error", type(exc).__name__, str(exc))


def _both(body: bytes):
    fast = _outcome(lambda b: PARSER.parse_body(_Request(b)), body)
    strict = _outcome(PARSER.parse_strictly, body)
    return fast, strict


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(value=json_values, ascii_only=st.booleans())
def test_the_fast_parse_reads_every_document_as_the_strict_parse_does(value, ascii_only):
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    fast, strict = _both(body)
    assert fast == strict
    # Types too: repr tells 1 from 1.0 and 0.0 from -0.0.
    assert fast[0] == "ok"


@pytest.mark.parametrize(
    "body",
    [
        b"NaN",
        b"[Infinity]",
        b'{"a": -Infinity}',
        b"1e400",
        b"[-1e400]",
        b'"\\ud800"',
        b'{"k": "x\\udfff"}',
        b'"\\ud83d\\ude00"',
        b"\xef\xbb\xbf{}",
        b"\xff\xfe",
        b"[" * 5_000 + b"]" * 5_000,
        b"18446744073709551616",
        b"[-9223372036854775809, 1]",
        b'{"uri": "s3://b/12345678901234567890"}',
        b'{"a": 1, "a": 2}',
        b"{} x",
        b'"\x01"',
        b"",
        b"-0",
        b"-0.0",
        b"4.9e-324",
        b"1e-400",
    ],
)
def test_edge_documents_get_the_same_answer_from_both_parses(body):
    fast, strict = _both(body)
    assert fast == strict


def test_orjson_reads_a_plain_success_body():
    """The fast path is taken (not only the fallback): orjson's result for a body the strict
    parse would read the same, with a huge integer kept out of it."""
    calls = []
    original = PARSER.parse_strictly

    def spy(body):
        calls.append(body)
        return original(body)

    PARSER.parse_strictly = spy
    try:
        assert PARSER.parse_body(_Request(b'{"state": "success", "n": 1.5}')) == {
            "state": "success",
            "n": 1.5,
        }
        assert calls == []
        assert PARSER.parse_body(_Request(b'{"n": 123456789012345678901}')) == {
            "n": 123456789012345678901
        }
        assert len(calls) == 1
    finally:
        del PARSER.parse_strictly
