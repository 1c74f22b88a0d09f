"""The schema of DESIGN.md section 2, one module per area.

Owns: every table of the service (`migrations/` holds their history). Who writes each table is
said by the package that owns the write (`registration`: events, alias links and ADRQ rows;
`scheduling`: runs and their TIs; `task_state`: TI state; `outbox`: outbox rows...); only
`operations.retention` deletes history (invariant 14, `docs/retention.md`).

Writes: nothing by itself (no model method writes another table).

May import: Django and `guards` (the stored JSON decoder of `guards.limits`, `guards.masking` for
what a row's `__str__` shows), nothing else of the service.
"""

from .assets import Asset, AssetAlias, AssetAliasAsset
from .audit import AuditEntry, AuditTarget, AuditVia
from .auth import ApiToken, RevokedToken
from .backfills import (
    Backfill,
    BackfillDagRun,
    BackfillDagRunExceptionReason,
    ReprocessBehavior,
)
from .callbacks import CallbackState, DagCallbackRequest
from .dags import (
    Dag,
    DagCode,
    DagFavorite,
    DagImportError,
    DagScheduleAliasReference,
    DagScheduleAssetReference,
    DagVersion,
    MapCombine,
    ScheduleMode,
    SetupLinkKind,
    Task,
    TaskOutletAliasReference,
    TaskOutletAssetReference,
    TaskSetupLink,
    TaskUpstream,
    TriggerRule,
    WeightRule,
    WorkerBundle,
    XComReadScope,
)
from .events import AssetAliasEvent, AssetEvent
from .hitl import HITLDetail
from .logs import TaskLogChunk
from .metrics import ComponentHeartbeat, MetricCounter
from .pools import DEFAULT_POOL_NAME, Pool
from .queue import AssetDagRunQueue, AssetEventQueue, FailureKind
from .runs import (
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    DagRunTriggeredBy,
    DagRunType,
    TaskInstance,
    TIState,
)
from .runtime import (
    AssetStateStore,
    AssetStateWriter,
    Connection,
    RenderedTaskFields,
    TaskReschedule,
    TaskStateStore,
    Variable,
    XCom,
)
from .triggers import Trigger
from .watchers import MessageState, ParkReason, QueueWatcher, WatcherMessage, WatcherRoute
from .webhooks import (
    DeliveryState,
    EndpointState,
    FreshnessKind,
    FreshnessPolicy,
    FreshnessState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
    WebhookSubscription,
)

__all__ = [
    "DEFAULT_POOL_NAME",
    "ApiToken",
    "Asset",
    "AssetAlias",
    "AssetAliasAsset",
    "AssetAliasEvent",
    "AssetDagRunQueue",
    "AssetEvent",
    "AssetEventQueue",
    "AssetStateStore",
    "AssetStateWriter",
    "AuditEntry",
    "AuditTarget",
    "AuditVia",
    "Backfill",
    "BackfillDagRun",
    "BackfillDagRunExceptionReason",
    "CallbackState",
    "ComponentHeartbeat",
    "Connection",
    "Dag",
    "DagCallbackRequest",
    "DagCode",
    "DagFavorite",
    "DagImportError",
    "DagRun",
    "DagRunAssetEvent",
    "DagRunState",
    "DagRunTriggeredBy",
    "DagRunType",
    "DagScheduleAliasReference",
    "DagScheduleAssetReference",
    "DagVersion",
    "DeliveryState",
    "EndpointState",
    "FailureKind",
    "FreshnessKind",
    "FreshnessPolicy",
    "FreshnessState",
    "HITLDetail",
    "MapCombine",
    "MessageState",
    "MetricCounter",
    "ParkReason",
    "Pool",
    "QueueWatcher",
    "RenderedTaskFields",
    "ReprocessBehavior",
    "RevokedToken",
    "ScheduleMode",
    "SetupLinkKind",
    "TIState",
    "Task",
    "TaskInstance",
    "TaskLogChunk",
    "TaskOutletAliasReference",
    "TaskOutletAssetReference",
    "TaskReschedule",
    "TaskSetupLink",
    "TaskStateStore",
    "TaskUpstream",
    "Trigger",
    "TriggerRule",
    "Variable",
    "WatcherMessage",
    "WatcherRoute",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEventType",
    "WebhookSubscription",
    "WeightRule",
    "WorkerBundle",
    "XCom",
    "XComReadScope",
]
