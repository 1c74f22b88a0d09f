"""`manage.py` commands: the shell door of the service (`commands/`).

Owns: one command per operator task (sync Dags, trigger, backfill, requeue, retention's
`db_clean`, the worker, the schedulers, the cluster...), each thin over one domain function.

Writes: nothing itself. May import: every layer and shared package (a door).
"""
