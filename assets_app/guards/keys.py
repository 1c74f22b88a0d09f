"""Keys the service makes for itself when the operator configures none.

`generated_key(name)` keeps one random value per name in a file under the key directory
(`KEY_DIR`, default `var/keys/`), created with mode 0600 and reused on every later start, the
way Airflow generates its Fernet key: no key of ours is published in the repository, and every
process of one installation (gunicorn workers, the django-q2 cluster, commands) reads the same
value. Imported by `project/settings.py`, so it imports nothing from Django.

Published values: what earlier versions shipped as defaults (and `.env.example` showed). A
service configured with one of them is refused by the system checks (`assets_app/guards/checks.py`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

PUBLISHED_VALUES = frozenset(
    {
        "dev-only-insecure-secret-key-change-me-in-production",
        "dev-worker-api-key",
        "admin",
    }
)


def random_token() -> str:
    """64 url-safe characters (48 random bytes)."""
    return secrets.token_urlsafe(48)


def generated_key(name: str, *, directory: Path, make: Callable[[], str] = random_token) -> str:
    """The key `name` kept in `directory/name`: read it, or create it with `make()` when missing.

    Safe when several processes start at once: the value is written to a private temporary
    file (0600) that is then hard-linked into place, which fails if another process got there
    first; every process then reads the one file that won. A file that exists but is empty or
    readable by others is refused (ValueError) rather than used or silently replaced."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    if not path.exists():
        temporary = directory / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(make() + "\n")
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):  # another process won: read its key
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(
            f"key file {path} is readable by others (mode {mode:o}); chmod 600 it or remove it"
        )
    value = path.read_text().strip()
    if not value:
        raise ValueError(f"key file {path} is empty; remove it to generate a new key")
    return value
