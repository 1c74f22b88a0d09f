"""The timers process (issue 41): `manage.py run_timers` forks one child per group of timers
(`timers-time`, `timers-events`, `timers-upkeep`; the last two niced), forks a child again at once when it is
SIGKILLed (the others untouched), and stops every child on SIGTERM, leaving no process."""

import contextlib
import signal
import time

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GROUPS = {"timers-time", "timers-events", "timers-upkeep"}


def children(pid: int) -> dict[str, int]:
    found = {}
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            found[child.name()] = child.pid
    return found


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("not within the timeout")


def test_a_killed_child_is_forked_again_alone_and_sigterm_leaves_nothing(servers):
    process = servers("timers")
    first = wait_for(lambda: (c := children(process.pid)).keys() >= GROUPS and c, 30)
    assert set(first) == GROUPS
    # The background groups yield the cores to the time scheduler's (TIMERS_BACKGROUND_NICE).
    base = psutil.Process(process.pid).nice()
    nices = {name: psutil.Process(pid).nice() - base for name, pid in first.items()}
    assert nices == {"timers-time": 0, "timers-events": 5, "timers-upkeep": 5}
    killed = psutil.Process(first["timers-time"])
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    started = time.monotonic()
    again = wait_for(
        lambda: (c := children(process.pid)).get("timers-time") not in (None, killed.pid) and c,
        10,
    )
    assert time.monotonic() - started < 3
    # The other groups' children were not touched.
    assert again["timers-events"] == first["timers-events"]
    assert again["timers-upkeep"] == first["timers-upkeep"]
    every = [psutil.Process(pid) for pid in again.values()]
    process.proc.send_signal(signal.SIGTERM)
    process.proc.wait(15)
    _, alive = psutil.wait_procs(every, timeout=15)
    assert alive == []
