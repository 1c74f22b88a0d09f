"""Queue watchers (issue 28): the consumer process, and each RabbitMQ message it takes.

Owns: `messages` (a message's routes matched, its events registered or the message parked, in one
transaction with its dedup row; requeueing parked messages) and `consumer` (the consumer process of
`manage.py watch_queues`: connections, acks, reconnect backoff, periodic checks).

Writes: `WatcherMessage` (one row per message taken: the dedup guard and the parked ones, through
`sql.watchers`) and the state fields of `QueueWatcher` (an operator's delete takes a watcher with
its routes and messages, audited). Watchers and routes are written by `definitions.sync`; the events
by `registration`.

May import: `registration`, `scheduling`, `events_out` and the shared packages.
"""
