"""The timers process (issue 41): `manage.py run_timers` forks one child per group of timers
(`timers-time`, twice by default, `timers-events`, `timers-upkeep`; the last two niced), forks a
child again at once when it is SIGKILLed (the others untouched), and stops every child on
SIGTERM, leaving no process."""

import collections
import contextlib
import signal
import time

import psutil
import pytest

from .conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GROUPS = collections.Counter({"timers-time": 2, "timers-events": 1, "timers-upkeep": 1})


def children(pid: int) -> dict[int, str]:
    found = {}
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            found[child.pid] = child.name()
    return found


def test_a_killed_child_is_forked_again_alone_and_sigterm_leaves_nothing(servers):
    process = servers("timers")
    first = wait_until(
        lambda: (c := children(process.pid)) and collections.Counter(c.values()) == GROUPS and c,
        timeout=30,
    )
    # The background groups yield the cores to the time scheduler's (TIMERS_BACKGROUND_NICE).
    base = psutil.Process(process.pid).nice()
    nices = {name: psutil.Process(pid).nice() - base for pid, name in first.items()}
    assert nices == {"timers-time": 0, "timers-events": 5, "timers-upkeep": 5}
    killed = next(pid for pid, name in first.items() if name == "timers-time")
    psutil.Process(killed).send_signal(signal.SIGKILL)
    started = time.monotonic()
    again = wait_until(
        lambda: (
            (c := children(process.pid))
            and killed not in c
            and collections.Counter(c.values()) == GROUPS
            and c
        ),
        timeout=10,
    )
    assert time.monotonic() - started < 3
    # The other children were not touched.
    assert set(first) - {killed} <= set(again)
    every = [psutil.Process(pid) for pid in again]
    process.proc.send_signal(signal.SIGTERM)
    process.proc.wait(15)
    _, alive = psutil.wait_procs(every, timeout=15)
    assert alive == []
