"""What a running task reads and writes besides its own state (DESIGN 6.1, 2).

Owns: `requests` (rendered fields, inlet/outlet validation, previous runs, reschedule dates, counts
and states of other TIs and runs, dag-run reads / trigger / clear), `xcoms`, `variables` (Variables
and Connections, secrets encrypted by `guards.encryption`), `logs` (shipped task log chunks, read
back by the admin and the public API), `state_store` (the task and asset state store, AIP-103) and
`scopes` (what a task token may do beyond its own TI's state routes).

Writes: `XCom`, `Variable`, `Connection`, `RenderedTaskFields`, `TaskLogChunk`, `TaskStateStore`,
`AssetStateStore`. It deletes the XComs a task or an operator deletes (Airflow's XCom delete),
the state keys a task or an operator deletes, and the Variables and Connections an operator
deletes; never history (retention's).

May import: the layers to its right (`outbox` ... `events_out`; a run-time trigger creates runs
through `scheduling.runs`) and the shared packages; never `task_state` or a door.
"""
