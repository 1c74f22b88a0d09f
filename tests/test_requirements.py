"""The lock files agree with the direct pins (bin/lock regenerates them)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)")


def _pins(name: str) -> dict[str, str]:
    """{normalized name: version} of the `name==version` lines of a requirements file (extras
    such as psycopg[binary] are dropped; `-r` includes are not followed)."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            package = re.sub(r"\[.*\]", "", match.group(1))
            pins[re.sub(r"[-_.]+", "-", package).lower()] = match.group(2)
    return pins


def test_every_direct_pin_is_locked_at_its_version():
    for direct, lock in (
        ("requirements.txt", "requirements.lock"),
        ("requirements.txt", "requirements-dev.lock"),
        ("requirements-dev.txt", "requirements-dev.lock"),
    ):
        locked = _pins(lock)
        wanted = _pins(direct)
        assert wanted, direct
        wrong = {p: (v, locked.get(p)) for p, v in wanted.items() if locked.get(p) != v}
        assert not wrong, f"{direct} vs {lock} (run bin/lock): {wrong}"


def test_the_dev_lock_holds_the_service_lock():
    service, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    differ = {p: (v, dev.get(p)) for p, v in service.items() if dev.get(p) != v}
    assert not differ, f"requirements.lock pins that requirements-dev.lock does not: {differ}"


def test_the_service_lock_has_no_test_or_tool_package():
    service = _pins("requirements.lock")
    dev_only = set(_pins("requirements-dev.txt")) - set(_pins("requirements.txt"))
    assert dev_only and not dev_only & set(service), dev_only & set(service)
