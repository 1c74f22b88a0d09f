"""Registration: outlets -> asset events, alias links and queued events (ADRQ rows).

Owns: `outlets` (a payload registered: its events with their idempotency keys, alias links, and the
ADRQ rows of every Dag scheduled on them, inserted in the one global lock order, invariant 4) and
`payloads` (the outbox payload's types, defined once: what a success body carries, the outbox stores
and registration reads).

Writes: `AssetEvent`, `AssetAliasEvent`, `AssetAliasAsset` and `AssetDagRunQueue`, as their only
writer (the public API's external events and the watchers come through here too), and the `Asset` /
`AssetAlias` rows an outlet names for the first time. It deletes nothing.

May import: `scheduling`, `events_out` and the shared packages.
"""
