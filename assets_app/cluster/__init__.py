"""The django-q2 side of the service, besides the entry points in `assets_app.tasks`.

Owns: `nudges` (asking the cluster to drain or schedule soon, sent robustly after commit), `broker`
(django-q2's ORM broker woken by PostgreSQL NOTIFY instead of polling) and `sweeps`
(`setup_schedules`: the periodic Schedule rows behind the nudges).

Writes: django-q2's own tables only (`OrmQ` through the broker, `Schedule` rows by name of
`assets_app.tasks.*`). With `tasks` and the `qcluster` command, the only modules that import
`django_q` (tests/test_architecture.py).

May import: the shared packages only; never `assets_app.tasks` (it names the entry points by their
dotted path).
"""
