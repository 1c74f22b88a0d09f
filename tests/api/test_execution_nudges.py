"""A nudge that fails after commit: the committed success stays a success (issue 15).

The request commits, then its on-commit drain nudge raises. The answer must still be 204, the
failure one warning line naming the nudge, and the outbox row still registered by the drain that
the sweep runs (called directly here: no cluster runs in tests).
"""

import logging

import pytest
from django.db import OperationalError

from assets_app.cluster import nudges
from assets_app.models import AssetEvent, AssetEventQueue, TIState
from assets_app.outbox import drain
from tests.factories import TaskInstanceFactory

from .test_execution_state import SUCCESS, patch_state


def _broker_away(**kwargs) -> None:
    raise OperationalError("could not connect to server\nIs the server running on that host?")


@pytest.mark.django_db(transaction=True)
def test_a_drain_nudge_that_raises_after_commit_leaves_a_204_and_the_sweep_registers(
    worker_api, monkeypatch, caplog
):
    monkeypatch.setattr(nudges, "nudge_drain", _broker_away)
    ti = TaskInstanceFactory(running=True)

    with caplog.at_level(logging.WARNING, logger="assets_app.cluster.nudges"):
        response = patch_state(worker_api, ti, SUCCESS)

    assert response.status_code == 204
    ti.refresh_from_db()
    assert ti.state == TIState.SUCCESS
    warnings = [r for r in caplog.records if r.name == "assets_app.cluster.nudges"]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    message = warnings[0].getMessage()
    assert "_broker_away" in message and "OperationalError" in message
    assert "\n" not in message
    assert AssetEventQueue.objects.count() == 1

    result = drain.drain()  # what the one-minute sweep runs

    assert result.registered == 1
    assert AssetEventQueue.objects.count() == 0
    assert set(AssetEvent.objects.values_list("asset__name", flat=True)) == {
        "orders",
        "orders_clean",
    }


@pytest.mark.django_db(transaction=True)
def test_the_drain_nudge_is_sent_once_the_success_commits(worker_api, monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(nudges, "nudge_drain", lambda: sent.append(AssetEventQueue.objects.count()))
    ti = TaskInstanceFactory(running=True)

    assert patch_state(worker_api, ti, SUCCESS).status_code == 204

    assert sent == [1]  # after the commit: the nudge's own connection sees the row
