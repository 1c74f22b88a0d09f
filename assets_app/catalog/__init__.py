"""Reading what exists: Dags, runs, TIs, assets, events and queued events, for APIs and admin.

Owns: `dags`, `run_reads`, `asset_events` (the public and worker API reads of assets, aliases and
events), `queued_events` (ADRQ rows as operators see them: list and clear), `listing` (Airflow's
list semantics: `order_by`, patterns, ranges, offset and cursor pages), `lineage` (the graph of the
lineage page), `task_order` and `task_graph` (a Dag's tasks in Airflow's order and as its graph
view draws them), `run_waits` (the bounded run `wait` stream) and `asset_activity` (which declared
assets Airflow would call active: a task's inlet and outlet check).

Writes: almost nothing: `Dag.is_paused` (pause / unpause; an unpause stores the Dag's next run
through `definitions.next_runs`), an asset's `uri` when an external event
renames it, and the ADRQ rows an operator clears (deleted, audited). Everything else is read without
locks, a fixed number of queries per page.

May import: the shared packages only (it is shared: every layer may read through it).
"""
