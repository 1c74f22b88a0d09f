"""The outbox: the hand-off between a TI's success and the registration of its events.

Owns: `rows` (enqueue in the success's own transaction, claim with SKIP LOCKED, retry with backoff,
park, requeue, the reads of the admin and the dashboard) and `drain` (the loop that claims due rows
in batches, registers them through `registration` and yields to the web tier).

Writes: `AssetEventQueue` (the outbox rows), as its only writer. The drain deletes a row in the
transaction that registers it (invariant 3); an operator deletes, parks or requeues one through
`rows` (audited). The events themselves are written by `registration`.

May import: the layers to its right (`watchers`, `registration`, `scheduling`, `events_out`) and the
shared packages; never `task_state`, `runtime` or a door.
"""
