"""`bin/airflow-worker --triggerer`: a triggerer for the service's deferred TIs (issue 42).

It does what Airflow 3.3.2's triggerer (`airflow/jobs/triggerer_job_runner.py`) does for task
triggers, against the service's triggerer routes instead of the metadata database:

- claims triggers (`POST /execution/triggers/claim`: a lease, renewed by every claim that
  names it in `held`; a triggerer that dies stops renewing, and another claims its triggers
  once the lease has ended: the service's `TRIGGER_LEASE_SECONDS`);
- builds each trigger as `TriggerRunner.create_triggers` does: the class imported from its
  classpath, the kwargs decoded by Airflow's own `Trigger._decrypt_kwargs` (JSON text, or a
  Fernet string with this environment's `[core] fernet_key`; then the Task SDK's serde, with
  Airflow's BaseSerialization as the fallback) and `smart_decode_trigger_kwargs`, the TI set
  as its `task_instance`;
- runs them all on one asyncio loop (`run_trigger`: `async for event in trigger.run()`, with
  greenback's portal as Airflow opens it), up to `--triggerer-capacity` at once (Airflow's
  `[triggerer] capacity`, 1000);
- reports the first event (`POST /execution/triggers/{id}/event`, its payload serialized with
  the Task SDK's serde, as `handle_event_submit` stores it) or a failure (`.../failure` with
  the traceback lines: the trigger raised, could not be loaded or built, or ended without an
  event, as Airflow's `cleanup_finished_triggers` fails it), and stops the trigger; a trigger
  the service released (fired elsewhere, timed out, its TI moved on) is cancelled.

A trigger that reads through the execution API (`RuntimeTaskInstance.get_ti_count`,
`get_task_states`, `get_dr_count`, `get_dagrun_state`, `get_previous_ti`, Variables,
Connections, XComs: `DagStateTrigger`, the `WorkflowTrigger` of a deferrable
`ExternalTaskSensor`) is served as Airflow's triggerer supervisor serves it
(`TriggerRunnerSupervisor._handle_request`, with the Task SDK's own request handlers), over
HTTP with the task token the claim handed out for its TI's try (`_ExecutionComms`).

A trigger that ends its task itself (`end_from_trigger=True`: a `BaseTaskEndEvent`) is reported
to `POST /execution/triggers/{id}/end` with its state and XComs (serde), and the service ends
the TI as Airflow's `handle_event_submit` does.

Not supported (reported as the trigger's failure, so the task fails saying so, never waits):
other supervisor requests (HITL, the state store) from a trigger. Templated trigger fields are
not rendered (Airflow renders them when it has the serialized Dag).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys
import time
import traceback
import types
import uuid
from contextlib import suppress
from typing import Any

import httpx


def _say(message: str) -> None:
    print(f"[airflow-triggerer] {message}", file=sys.stderr, flush=True)


def build_trigger(workload: dict[str, Any]) -> Any:
    """The trigger of a claimed workload, built as Airflow's `TriggerRunner.create_triggers`
    builds it (see the module docstring)."""
    from airflow._shared.module_loading import import_string
    from airflow.models.trigger import Trigger
    from airflow.serialization.decoders import smart_decode_trigger_kwargs

    trigger_class = import_string(workload["classpath"])
    kw = Trigger._decrypt_kwargs(workload["encrypted_kwargs"])
    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in kw.items()}
    trigger = trigger_class(**kwargs)
    ti = dict(workload["ti"])
    ti["id"] = uuid.UUID(ti["id"])
    trigger.task_instance = types.SimpleNamespace(**ti)
    trigger.trigger_id = workload["id"]
    trigger.timeout_after = workload.get("timeout_after")
    return trigger


# The task token of the trigger running in this asyncio task (copied into the threads of its
# `sync_to_async` calls), for `_ExecutionComms`.
_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("trigger_token", default=None)


class _ExecutionComms:
    """The Task SDK's `SUPERVISOR_COMMS` for the triggers of this process: the requests
    Airflow's `TriggerRunnerSupervisor._handle_request` serves (the same Task SDK request
    handlers), sent to the service's execution API with the current trigger's task token."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._clients: dict[str, Any] = {}

    def _client(self) -> Any:
        from airflow.sdk.api.client import Client

        token = _TOKEN.get()
        if token is None:
            raise RuntimeError("an execution API request outside a trigger")
        if token not in self._clients:
            if len(self._clients) >= 1000:
                self._clients.clear()
            self._clients[token] = Client(base_url=self._server, token=token)
        return self._clients[token]

    def send(self, msg: Any) -> Any:
        from airflow.sdk.execution_time import comms
        from airflow.sdk.execution_time import request_handlers as handle

        handlers = {
            comms.GetTICount: handle.handle_get_ti_count,
            comms.GetTaskStates: handle.handle_get_task_states,
            comms.GetDRCount: handle.handle_get_dr_count,
            comms.GetDagRunState: handle.handle_get_dag_run_state,
            comms.GetPreviousTI: handle.handle_get_previous_ti,
            comms.GetVariable: handle.handle_get_variable,
            comms.GetConnection: handle.handle_get_connection,
            comms.GetXCom: handle.handle_get_xcom,
        }
        handler = handlers.get(type(msg))
        if handler is None:
            raise RuntimeError(
                f"{type(msg).__name__} from a trigger is not served by this service's triggerer"
            )
        response, _ = handler(self._client(), msg)
        return response

    async def asend(self, msg: Any) -> Any:
        return await asyncio.to_thread(self.send, msg)


def install_comms(server: str) -> None:
    """Make the Task SDK's `RuntimeTaskInstance` reads of triggers go to the service."""
    from airflow.sdk.execution_time import task_runner

    task_runner.SUPERVISOR_COMMS = _ExecutionComms(server)  # type: ignore[assignment]


def serialize_payload(payload: Any) -> Any:
    from airflow.sdk.serde import serialize

    return serialize(payload)


class Triggerer:
    """One triggerer process: its claim loop and its triggers, on one event loop."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        name: str,
        capacity: int = 1000,
        poll: float = 1.0,
        queues: list[str] | None = None,
    ) -> None:
        self._client = client
        self._name = name
        self._capacity = capacity
        self._poll = poll
        self._queues = queues
        self._running: dict[int, asyncio.Task] = {}
        self.fired = 0
        self.failed = 0

    async def run(self, *, max_seconds: float = 0, idle_exit: float = 0) -> None:
        started = idle_since = time.monotonic()
        while True:
            got = await self._claim()
            now = time.monotonic()
            if got or self._running:
                idle_since = now
            if max_seconds and now - started >= max_seconds:
                break
            if idle_exit and now - idle_since >= idle_exit:
                break
            await asyncio.sleep(self._poll)
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _claim(self) -> int:
        self._running = {i: t for i, t in self._running.items() if not t.done()}
        body: dict[str, Any] = {
            "triggerer": self._name,
            "limit": max(0, self._capacity - len(self._running)),
            "held": sorted(self._running),
        }
        if self._queues is not None:
            body["queues"] = self._queues
        try:
            response = await self._client.post("/execution/triggers/claim", json=body)
        except httpx.TransportError as exc:
            _say(f"claim failed ({exc!r}); retrying")
            return 0
        if response.status_code >= 500:
            _say(f"claim answered {response.status_code}; retrying")
            return 0
        if response.status_code != 200:
            raise SystemExit(
                f"[airflow-triggerer] claim refused ({response.status_code}): {response.text}"
            )
        answer = response.json()
        for trigger_id in answer["released"]:
            task = self._running.pop(trigger_id, None)
            if task is not None:
                task.cancel()
        for workload in answer["triggers"]:
            if workload["id"] in self._running:
                continue
            ti = workload["ti"]
            name = (
                f"{ti['dag_id']}/{ti['run_id']}/{ti['task_id']}/{ti['map_index']}/"
                f"{ti['try_number']} (ID {workload['id']})"
            )
            _say(f"trigger {name} starting ({workload['classpath']})")
            self._running[workload["id"]] = asyncio.create_task(
                self._run_trigger(workload, name), name=name
            )
        return len(answer["triggers"])

    async def _run_trigger(self, workload: dict[str, Any], name: str) -> None:
        from airflow.triggers.base import BaseTaskEndEvent

        trigger_id = workload["id"]
        _TOKEN.set(workload.get("token"))
        try:
            trigger = build_trigger(workload)
        except BaseException as exc:  # Airflow: "Trigger failed to load code"
            _say(f"trigger {name} could not be built: {exc!r}")
            await self._report(trigger_id, "failure", {"traceback": _lines(exc)})
            return
        if os.environ.get("AIRFLOW_DISABLE_GREENBACK_PORTAL", "").lower() != "true":
            import greenback

            await greenback.ensure_portal()
        try:
            async for event in trigger.run():
                if isinstance(event, BaseTaskEndEvent):
                    # The trigger ends the task itself (end_from_trigger=True): Airflow's
                    # handle_event_submit for a BaseTaskEndEvent, done by the service.
                    _say(f"trigger {name} ended its task: {event!r}")
                    xcoms = {k: serialize_payload(v) for k, v in (event.xcoms or {}).items()}
                    body = {"state": str(event.task_instance_state.value), "xcoms": xcoms}
                    await self._report(trigger_id, "end", body)
                    return
                _say(f"trigger {name} fired: {event!r}")
                payload = serialize_payload(event.payload)
                await self._report(trigger_id, "event", {"payload": payload})
                return
            _say(f"trigger {name} exited without sending an event; its task will fail")
            await self._report(trigger_id, "failure", {"traceback": None})
        except asyncio.CancelledError:
            _say(f"trigger {name} cancelled (released by the service)")
            raise
        except Exception as exc:
            _say(f"trigger {name} raised {exc!r}")
            await self._report(trigger_id, "failure", {"traceback": _lines(exc)})
        finally:
            with suppress(Exception):
                await trigger.cleanup()

    async def _report(self, trigger_id: int, kind: str, body: dict[str, Any]) -> None:
        """Post an event or failure until the service answers (a restart of the service loses
        nothing); a refusal (4xx) is said and dropped."""
        url = f"/execution/triggers/{trigger_id}/{kind}"
        content = json.dumps(body, default=str)
        delay = 0.5
        while True:
            try:
                response = await self._client.post(
                    url, content=content, headers={"Content-Type": "application/json"}
                )
            except httpx.TransportError as exc:
                _say(f"{kind} of trigger {trigger_id} not sent ({exc!r}); retrying")
            else:
                if response.status_code < 500:
                    break
                _say(f"{kind} of trigger {trigger_id} answered {response.status_code}; retrying")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)
        if response.status_code != 200:
            _say(
                f"{kind} of trigger {trigger_id} refused ({response.status_code}): {response.text}"
            )
            return
        if kind in ("event", "end"):
            self.fired += 1
        else:
            self.failed += 1


def _lines(exc: BaseException) -> list[str]:
    return traceback.format_exception(type(exc), exc, exc.__traceback__)


def run(
    *,
    url: str,
    api_key: str,
    name: str,
    capacity: int,
    max_seconds: float,
    idle_exit: float,
    queues: list[str] | None,
) -> int:
    """Run a triggerer until `max_seconds` / `idle_exit` (0: for ever) or a signal."""

    async def main() -> Triggerer:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            triggerer = Triggerer(client, name=name, capacity=capacity, queues=queues)
            await triggerer.run(max_seconds=max_seconds, idle_exit=idle_exit)
            return triggerer

    install_comms(url + "/execution/")
    _say(f"claiming triggers as {name} (capacity {capacity})")
    triggerer = asyncio.run(main())
    _say(f"{triggerer.fired} triggers fired, {triggerer.failed} failed")
    return 0
