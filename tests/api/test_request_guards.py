"""The raw-byte NUL check of ApiRequestGuardMiddleware: exact on UTF-8 JSON without parsing it."""

import json

import pytest

from assets_app.api.middleware import _body_has_nul


@pytest.mark.parametrize(
    ("value", "has_nul"),
    [
        ("plain", False),
        ("\x00", True),
        ("a\x00b", True),
        ("\\u0000", False),  # a backslash, then the text u0000
        ("\\\x00", True),  # a backslash, then a NUL
        ("\\\\u0000", False),
        ("\\\\\x00", True),
        ("u0000", False),
        ("\\", False),
    ],
)
def test_nul_in_a_json_string_is_found_and_escaped_backslashes_are_not(value, has_nul):
    body = json.dumps({"k": value, value: [value]}).encode()
    assert _body_has_nul(body) is has_nul


def test_raw_nul_bytes_and_a_leading_escape_are_found():
    assert _body_has_nul(b'{"k": 1}\x00') is True
    assert _body_has_nul(b"\\u0000") is True
    assert _body_has_nul(b"\\\\u0000") is False
    assert _body_has_nul(b"") is False
