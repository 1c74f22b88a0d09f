"""Every hand-written SQL statement and every database-dialect branch of the service, by owner.

Each function of this package runs one statement (or answers one dialect question) that the ORM
does not write as well; the comment above it gives the reason (a PostgreSQL feature, a measured
cost, a lock order) and its SQLite branch sits next to it. Domain modules call these functions
by name, importing the module of their owner (`from .sql import scheduling as scheduling_sql`),
and never open a cursor, write `.raw(` / `RawSQL` or look at a connection's vendor themselves
(`tests/test_sql_boundary.py` fails on one that does).

Owns: one module per owner of statements:

- `connection`: dialect questions, the prepared cursor, health, the metrics counter, the
  advisory lock, the broker's LISTEN / NOTIFY and its row check;
- `task_instances`: the success path's TI read and running -> success UPDATE;
- `dependencies`: the downstream evaluation (the trigger-rule table) and the run-finish UPDATE;
- `outbox`: the outbox row's INSERT;
- `registration`: events, their ADRQ rows, the registering transaction's constraint mode;
- `scheduling`: the ADRQ rows of a pass (lock, delete) and the consumed-event links;
- `retention`: the one-statement deletes of a clean's batches and their commit mode;
- `watchers`: a queue message's dedup row;
- `webhooks`: webhook messages written by matching subscriptions, and the delivery claim;
- `locks`: every row lock (`select_for_update`) the service takes, with the global lock order;
- `errors`: which database errors mean "full or away, retry later" (a 503).

Writes: the rows of the statements above, each on behalf of its owner (the package named in the
function's docstring); the owners, not this package, decide when.

May import: Django, the models, orjson and (for the LISTEN connection) psycopg, never a domain
module: the statements are the domain's, their callers own the transactions and locks
(each function says whether it runs in the caller's transaction). Nothing is re-exported here.
"""
