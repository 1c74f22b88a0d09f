"""The timers process (issue 41): work that becomes due at a time, done when it is due.

Owns: `loop` (a timer sleeps until the database says it is due, or until a NOTIFY wakes it:
`sql/wakeups.py`; one thread per timer, one LISTEN connection per process), `service` (the
service's timers: time schedules and backfills, webhook delivery, freshness, retention,
repair) and `process` (`manage.py run_timers`: a supervisor that forks the timers' child again
when it dies).

Writes: nothing itself: each timer calls the domain function that owns its tables
(`scheduling.time_runs`, `scheduling.backfills`, `events_out.delivery`, `events_out.freshness`,
`operations.retention`, `task_state.repair`).

May import: any package (it is a door, like `tasks`, on the far left of the flow); imported by
nothing but the `run_timers` command.
"""
