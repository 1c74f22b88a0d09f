"""What operators run and watch: retention, audit, metrics, heartbeats, the reference worker.

Owns: `retention` (the one writer that deletes history, invariant 14; `docs/retention.md` says who
may delete what), `audit` (who did what to which rows), `metrics` (counters shared by every
process), `observability` (gauges, activity, component health, the latency histogram, `/metrics`),
`heartbeats` (when a background component last ran), `logins` (login with a password: the JWT the
public API accepts, failed attempts audited and throttled) and `reference_worker` (our HTTP
worker, used by the demo and the tests).

Writes: `AuditEntry` and `AuditTarget`, `MetricCounter` and the latency histogram rows,
`ComponentHeartbeat`; retention deletes finished runs with their TIs, logs, XComs and links, old
asset events, audit entries and webhook messages, and nothing else (never an outbox row, an ADRQ
row, a Dag, an asset or a counter).

May import: the shared packages only.
"""
