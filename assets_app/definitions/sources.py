"""DAG files' source as the worker synced them (issue 45; Airflow's `DagCode`, `models/dagcode.py`).

`bin/airflow-worker` sends each file's text with the sync (`airflow_worker.dag_files`); the sync
stores it here in its own transaction, under the sync lock: one `DagCode` row per file, replaced
only when the text's md5 changed (Airflow's `source_code_hash`), so a replayed sync writes
nothing. A file longer than `DAG_SOURCE_MAX_BYTES` keeps its first bytes and its full size (the
page and the API say it was cut); the other files sync as usual. A sync of the whole folder (the
worker's, which reports its import errors) deletes the rows of files no longer in it. A file that
did not import, or whose Dags the service refused, keeps its last stored source: its Dags keep
what they were last synced as.
"""

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from ..models import Dag, DagCode
from ..models.dags import DAG_SOURCE_MAX_BYTES

__all__ = ["DAG_SOURCE_MAX_BYTES", "FileSource", "cut", "note", "record_sources", "source_of"]


@dataclass(frozen=True)
class FileSource:
    """One file's text as stored: `source` at most `DAG_SOURCE_MAX_BYTES` bytes of UTF-8,
    `size` the whole file's size in bytes."""

    fileloc: str
    source: str
    size: int

    @property
    def truncated(self) -> bool:
        return self.size > len(self.source.encode("utf-8"))


def cut(fileloc: str, text: str, *, size: int | None = None) -> FileSource:
    """The stored form of a file's text: its first `DAG_SOURCE_MAX_BYTES` bytes (at a character
    boundary) when longer. `size`: the whole file's size when the sender already cut it."""
    data = text.encode("utf-8", errors="replace")
    whole = max(size or 0, len(data))
    if len(data) > DAG_SOURCE_MAX_BYTES:
        text = data[:DAG_SOURCE_MAX_BYTES].decode("utf-8", errors="ignore")
    return FileSource(fileloc=fileloc, source=text, size=whole)


def source_hash(text: str) -> str:
    """Airflow's `DagCode.dag_source_hash`: the md5 of the UTF-8 text."""
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def _fileloc_hash(fileloc: str) -> str:
    return hashlib.md5(fileloc.encode("utf-8"), usedforsecurity=False).hexdigest()


def record_sources(
    sources: Sequence[FileSource],
    *,
    keep: Collection[str] | None = None,
    bundle_name: str | None = None,
    now: datetime | None = None,
) -> int:
    """Store `sources` (the caller holds the sync lock): a new file's row created, a changed
    one's replaced, an unchanged one left alone. With `keep` (the files of a whole-folder sync
    of `bundle_name`), the rows of every other file are deleted but those of the files another
    bundle's Dags come from (another worker's folder). Returns how many rows changed. Three
    statements, plus one UPDATE per changed file."""
    now = now or timezone.now()
    wanted = {_fileloc_hash(s.fileloc): s for s in sources}
    stored = {
        row.fileloc_hash: row
        for row in DagCode.objects.filter(fileloc_hash__in=list(wanted)).only(
            "fileloc_hash", "source_code_hash", "source_size"
        )
    }
    changed = 0
    fresh: list[DagCode] = []
    for key, source in wanted.items():
        digest = source_hash(source.source)
        row = stored.get(key)
        if row is None:
            fresh.append(
                DagCode(
                    fileloc_hash=key,
                    fileloc=source.fileloc,
                    source_code=source.source,
                    source_code_hash=digest,
                    source_size=source.size,
                    truncated=source.truncated,
                    last_updated=now,
                )
            )
        elif row.source_code_hash != digest or row.source_size != source.size:
            DagCode.objects.filter(pk=row.pk).update(
                source_code=source.source,
                source_code_hash=digest,
                source_size=source.size,
                truncated=source.truncated,
                last_updated=now,
            )
            changed += 1
    if fresh:
        DagCode.objects.bulk_create(fresh)
    if keep is not None:
        kept = {_fileloc_hash(f) for f in keep} | set(wanted)
        others = Dag.objects.exclude(bundle_name=bundle_name).values("fileloc")
        deleted, _ = (
            DagCode.objects.exclude(fileloc_hash__in=kept).exclude(fileloc__in=others).delete()
        )
        changed += deleted
    return changed + len(fresh)


def source_of(fileloc: str) -> DagCode | None:
    """The stored source of the file a Dag was synced from, or None (one query)."""
    if not fileloc:
        return None
    return DagCode.objects.filter(fileloc_hash=_fileloc_hash(fileloc)).first()


def note(code: DagCode) -> str:
    """What to say about a truncated source ("" when it is whole)."""
    if not code.truncated:
        return ""
    return (
        f"truncated: the file is {code.source_size:,} bytes; only its first "
        f"{DAG_SOURCE_MAX_BYTES:,} bytes are stored (the service's limit for a DAG file's source)"
    )
