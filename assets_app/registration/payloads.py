"""The outbox payload (`AssetEventQueue.payload`), defined once.

A success's outlets travel from the worker API to registration unchanged: the API's success
body (`api.schemas.TISuccessStatePayload`, Airflow's wire shape) validates `task_outlets` as
`AssetProfile`s and `outlet_events` as `OutletEvent`s, `outbox.enqueue` stores them with the TI
they came from (`build`: an `OutboxPayload`), and the drain hands the stored payload to
`registration.register_payloads`, which reads it as an `OutboxPayload` (and still checks each
value: a stored row may predate a rule, so a bad one is a `RegistrationError` that parks it).

Outlets are TypedDicts, not models: pydantic-core checks each outlet and hands back the dict
itself, which is what the payload stores. A model per outlet and its `model_dump` back into a
dict cost ~2 us per outlet on the success path (bench/success_breakdown.py). Outlet events stay
free-form (Airflow's `dict[str, Any]`).
"""

from datetime import datetime
from typing import Annotated, Any, NotRequired

from pydantic import AfterValidator, ConfigDict, Field, with_config
from typing_extensions import TypedDict

from ..guards import limits
from ..models import TaskInstance
from ..models.assets import ASSET_KEY_MAX_LENGTH

JsonDict = dict[str, Any]
AssetKeyPart = Annotated[str, Field(max_length=ASSET_KEY_MAX_LENGTH)]


@with_config(ConfigDict(extra="forbid"))
class AssetProfile(TypedDict):
    """A declared outlet: an Asset (name + uri), an AssetAlias (name), or a name/uri reference
    (`AssetNameRef` / `AssetUriRef`, resolved by registration)."""

    name: NotRequired[AssetKeyPart | None]
    uri: NotRequired[AssetKeyPart | None]
    type: str


def _bounded_outlet_event(event: JsonDict) -> JsonDict:
    """An outlet event stays free-form (Airflow's `dict[str, Any]`), but the asset and alias
    names in it become columns when the drain registers it: over-long ones are a 422 now rather
    than an outbox row that can only be parked. Its `extra` and `dest_asset_extra` nest at most
    `limits.MAX_JSON_DEPTH` levels and stay within the width and size limits, as at every other
    door."""
    for json_field in ("extra", "dest_asset_extra"):
        path = limits.too_deep_path(event.get(json_field))
        if path is not None:
            raise ValueError(
                f"{json_field}{limits.abbreviate(path)}: "
                f"{limits.depth_message(limit=limits.MAX_JSON_DEPTH)}"
            )
        wide = limits.too_wide(event.get(json_field))
        if wide is not None:
            raise ValueError(f"{json_field}{limits.abbreviate(wide[0])}: {wide[2]}")
    key = event.get("dest_asset_key")
    named = [("source_alias_name", event.get("source_alias_name"))]
    if isinstance(key, dict):
        named += [(f"dest_asset_key.{part}", key.get(part)) for part in ("name", "uri")]
    for where, value in named:
        if isinstance(value, str) and len(value) > ASSET_KEY_MAX_LENGTH:
            raise ValueError(f"{where} must have at most {ASSET_KEY_MAX_LENGTH} characters")
    return event


# {"dest_asset_key": {"name", "uri"}, "extra": {...}} or, through an alias,
# {"source_alias_name": str, "dest_asset_key": {...}, "dest_asset_extra": {...}, "extra": {...}}
OutletEvent = Annotated[JsonDict, AfterValidator(_bounded_outlet_event)]


@with_config(ConfigDict(extra="forbid"))
class Source(TypedDict):
    """The TI try the events come from: everything registration needs even after the TI is
    deleted."""

    ti_id: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int


@with_config(ConfigDict(extra="forbid"))
class OutboxPayload(TypedDict):
    outlets: list[AssetProfile]  # as the worker declared them
    outlet_events: list[JsonDict]  # `OutletEvent`s, as the worker sent them
    source: Source
    end_date: str  # ISO 8601


def build(
    *,
    ti: TaskInstance,
    outlets: list[AssetProfile],
    outlet_events: list[JsonDict],
    end_date: datetime,
) -> OutboxPayload:
    """The payload of `ti`'s success with these outlets (stored as they came, not copied)."""
    return {
        "outlets": outlets,
        "outlet_events": outlet_events,
        "source": {
            "ti_id": str(ti.id),
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": ti.map_index,
            "try_number": ti.try_number,
        },
        "end_date": end_date.isoformat(),
    }
