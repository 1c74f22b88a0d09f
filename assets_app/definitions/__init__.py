"""Dag definitions: the documents that say what exists and when it runs (DESIGN 6.3).

Owns: `sync` (parse, validate and sync DAG definition files: `sync_dags` and the worker's sync),
`schema` (the document as pydantic models, and the JSON Schema published for DAG authors),
`conditions` (the schedule condition language: parse, references, evaluate), `timetables`
(Airflow's timetables as pure computation: when a run is due, which interval it covers),
`partitions` (Airflow's partition mappers and partition keys as pure computation) and
`next_runs` (a Dag's stored next run: computed at a sync, an unpause and by the time scheduler).

Writes: `Dag`, `Task`, `Asset`, `AssetAlias`, the schedule and outlet references, `QueueWatcher` and
`WatcherRoute` (from the files), `DagImportError`, `DagCode` (`sources`: the files' text); it
deletes the tasks, routes, import errors and sources a new version of the folder no longer
has. Never runs, TIs or events.

May import: the shared packages only.
"""
