"""`python manage.py db_clean`: delete old history by the retention policy (Airflow's
`airflow db clean` options where they apply; assets_app/operations/retention.py does the work).

Examples:
    python manage.py db_clean --dry-run                       # what the policy would delete
    python manage.py db_clean -y                              # delete it, no question asked
    python manage.py db_clean --tables asset_event,xcom --clean-before-timestamp 2026-01-01 -y
"""

import sys
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import dateparse, timezone

from assets_app.operations import audit, retention

PROGRESS_EVERY = 20


class Command(BaseCommand):
    help = "Delete history older than the retention policy, in small batches."

    def add_arguments(self, parser):
        parser.add_argument(
            "--clean-before-timestamp",
            help="delete rows older than this (ISO 8601; naive: TIME_ZONE) instead of the ages "
            "of the policy; the rules that keep rows still hold",
        )
        parser.add_argument(
            "--tables", help=f"comma-separated, of {', '.join(retention.TABLES)} (default: all)"
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--batch-size", type=int, help="rows per transaction")
        parser.add_argument(
            "--sleep-ratio",
            type=float,
            help="after each batch, sleep this many times as long as it took (default: "
            "RETENTION_SLEEP_RATIO; 0: as fast as it can)",
        )
        parser.add_argument("--export-dir", help="write deleted rows here first (JSON Lines)")
        parser.add_argument("-y", "--yes", action="store_true", help="do not ask to confirm")
        parser.add_argument("--verbose", action="store_true", help="a line per batch")

    def handle(self, *args, **options):
        before = _timestamp(options["clean_before_timestamp"])
        tables = [t.strip() for t in (options["tables"] or "").split(",") if t.strip()]
        if not options["dry_run"] and not options["yes"]:
            self._confirm(tables, before)
        try:
            result = retention.clean(
                tables=tables or None,
                before=before,
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
                sleep_ratio=options["sleep_ratio"],
                export_dir=options["export_dir"],
                actor=audit.Actor.os_user(),
                progress=self._progress(options["verbose"]),
            )
        except retention.RetentionError as error:
            raise CommandError(str(error)) from error
        verb = "would delete" if result.dry_run else "deleted"
        self.stdout.write(f"{'dry run: ' if result.dry_run else ''}{verb} {result.total} rows")
        for table, n in sorted(result.counts.items()):
            self.stdout.write(f"  {table:<22} {n}")
        self.stdout.write(
            f"{result.batches} batches, longest transaction "
            f"{result.longest_transaction_ms:.0f} ms, paused {result.paused_seconds:.1f} s"
        )
        for path in result.export_files:
            self.stdout.write(f"exported to {path}")

    def _confirm(self, tables, before) -> None:
        what = ", ".join(tables) if tables else "every table of the policy"
        if not sys.stdin.isatty():
            raise CommandError("refusing to delete without --yes (no terminal to ask on)")
        when = f" older than {before.isoformat()}" if before else ""
        answer = input(f"Delete rows of {what}{when}? This cannot be undone. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise CommandError("cancelled")

    def _progress(self, verbose: bool):
        """Every batch with --verbose (its duration too), else every PROGRESS_EVERY batches."""
        batches = [0]

        def report(table: str, rows: int, ms: float) -> None:
            batches[0] += 1
            if verbose:
                self.stderr.write(f"  {table}: {rows} rows so far (batch {ms:.0f} ms)")
            elif batches[0] % PROGRESS_EVERY == 0:
                self.stderr.write(f"  {table}: {rows} rows so far ({batches[0]} batches)")

        return report


def _timestamp(text: str | None):
    if not text:
        return None
    value = dateparse.parse_datetime(text)
    if value is None:
        day = dateparse.parse_date(text)
        if day is None:
            raise CommandError(f"--clean-before-timestamp: not a date or time: {text!r}")
        value = datetime(day.year, day.month, day.day)
    return value if timezone.is_aware(value) else timezone.make_aware(value)
