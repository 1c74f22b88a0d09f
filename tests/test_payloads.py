"""assets_app.registration.payloads: the outbox payload, one definition for the API, the outbox and
registration."""

import functools
import typing

import pytest
from pydantic import TypeAdapter, ValidationError

from assets_app.api import schemas
from assets_app.models import AssetEvent, AssetEventQueue
from assets_app.outbox import drain
from assets_app.registration import outlets as registration
from assets_app.registration import payloads
from tests.api.conftest import WorkerClient
from tests.api.test_execution_state import SUCCESS, patch_state
from tests.factories import TaskInstanceFactory

pytestmark = pytest.mark.django_db


@functools.cache
def stored_payload() -> TypeAdapter[payloads.OutboxPayload]:
    return TypeAdapter(payloads.OutboxPayload)


def test_the_success_body_takes_its_outlets_in_the_payloads_types():
    hints = typing.get_type_hints(schemas.TISuccessStatePayload, include_extras=True)
    assert hints["task_outlets"] == list[payloads.AssetProfile] | None
    assert hints["outlet_events"] == list[payloads.OutletEvent] | None
    assert typing.get_type_hints(payloads.OutboxPayload)["outlets"] == list[payloads.AssetProfile]


def test_a_stored_success_payload_is_an_outbox_payload_that_registration_reads():
    ti = TaskInstanceFactory(running=True)
    assert patch_state(WorkerClient(), ti, SUCCESS).status_code == 204
    (row,) = AssetEventQueue.objects.all()

    stored = stored_payload().validate_python(row.payload)  # as read back from the database

    assert stored == row.payload
    assert stored["source"]["ti_id"] == str(ti.id)
    assert drain.drain().registered == 1
    assert AssetEvent.objects.filter(source_ti_id=ti.id).count() == 2


def test_the_payload_type_refuses_a_key_it_does_not_declare():
    ti = TaskInstanceFactory(running=True)
    built = payloads.build(ti=ti, outlets=[], outlet_events=[], end_date=ti.start_date)
    stored_payload().validate_python(built)

    with pytest.raises(ValidationError, match="extra"):
        stored_payload().validate_python({**built, "outlet": []})
    with pytest.raises(ValidationError, match="source"):
        stored_payload().validate_python({**built, "source": {**built["source"], "pool": "x"}})


def test_registration_reads_a_built_payload():
    ti = TaskInstanceFactory(running=True)
    built = payloads.build(
        ti=ti,
        outlets=[{"name": "orders", "uri": "s3://bucket/orders", "type": "Asset"}],
        outlet_events=[],
        end_date=ti.start_date,
    )

    result = registration.register_payload(payload=built)

    assert result.events_written == 1
    assert AssetEvent.objects.get().asset.name == "orders"
