"""Scheduling: every way a DagRun and its task instances come to exist, and what follows a finish.

Owns: `runs` (creating runs and their TIs: manual trigger, materialize, the schedulers; a TI's
initial state; clearing a run), `asset_runs` (ADRQ -> asset-triggered runs), `time_runs` (the time
scheduler's pass over Dags with a timetable), `backfills` (plan, start, pause, cancel), `mapping` (a
mapped task's TI becomes its map indexes), `dependencies` (after a TI's finish commits: the run's
waiting TIs by trigger rule, then the run's own finish) and `timeouts` (a running run past its
Dag's `dagrun_timeout` fails, its unfinished TIs skipped).

Writes: `DagRun` and `TaskInstance` rows (created here only; their state afterwards is
`task_state`'s), `DagRunAssetEvent` (the events a run consumed), `Backfill` and `BackfillDagRun`,
and the scheduling fields of `Dag` (next run, schedule error). It deletes only the ADRQ rows a new
run consumes (`sql.scheduling`); a clear resets a run's TIs, it deletes none.

May import: `events_out` and the shared packages.
"""
