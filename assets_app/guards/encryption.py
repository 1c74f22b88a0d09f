"""Encryption at rest of secrets (Connections' password and extra, Variable values, webhook
signing secrets) with Fernet, as Airflow does.

The key comes from `FERNET_KEY` (read at call time; several comma-separated keys decrypt with any
and encrypt with the first, for rotation). When it is unset a key is generated once and kept in
`FERNET_KEY_FILE` (under `var/`), so a demo works without set-up and keeps working across
restarts. A key that is malformed, or that cannot decrypt what is stored, is `SecretsUnreadable`
(HTTP 503 naming the setting), never a 500 and never a silently empty secret.
"""

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from . import exceptions


class SecretsUnreadable(exceptions.Unavailable):
    reason = "fernet_key_invalid"


def _keys() -> list[str]:
    configured = [k.strip() for k in settings.FERNET_KEY.split(",") if k.strip()]
    if configured:
        return configured
    return [_generated_key(Path(settings.FERNET_KEY_FILE))]


def _generated_key(path: Path) -> str:
    """The key kept in `path`, created (mode 0600, written once with O_EXCL so two processes
    starting together agree on one key) when missing."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key().decode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def _fernet() -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in _keys()])
    except ValueError as exc:
        raise SecretsUnreadable(
            f"FERNET_KEY is not a valid Fernet key (32 url-safe base64-encoded bytes): {exc}"
        ) from exc


def encrypt(value: str | None) -> str | None:
    """The Fernet token of `value` (None stays None)."""
    if value is None:
        return None
    return _fernet().encrypt(value.encode()).decode()


def decrypt(token: str | None) -> str | None:
    """The clear text of a stored token (None stays None); SecretsUnreadable when no configured
    key decrypts it (the key changed, or the row was written elsewhere)."""
    if token is None:
        return None
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretsUnreadable(
            "a stored secret cannot be decrypted with FERNET_KEY: the key differs "
            "from the one it was encrypted with (set the old key first in FERNET_KEY to rotate)"
        ) from exc


def check_key() -> str | None:
    """A message when FERNET_KEY is set but malformed, else None (a system check uses it)."""
    if not settings.FERNET_KEY.strip():
        return None
    try:
        _fernet()
    except SecretsUnreadable as exc:
        return exc.message
    return None


def check_key_reads_stored() -> None:
    """Before any secret is written (issues 26, 38), in the writing transaction: the current
    FERNET_KEY must decrypt the newest stored secret of each kind (a Connection's password or
    extra, a webhook endpoint's signing secret, an encrypted Variable value, a broker URL's
    password), else SecretsUnreadable (503) and the caller writes nothing: a secret encrypted
    under a wrong key would be unreadable for good once the right key is back. Four reads of one
    row each; nothing stored yet: any valid key will do."""
    from django.db.models import Q

    from ..models import Connection, QueueWatcher, Variable, WebhookEndpoint

    _fernet()  # a malformed key is refused even when nothing is stored yet
    connection = (
        Connection.objects.filter(Q(password__isnull=False) | Q(extra__isnull=False))
        .order_by("-pk")
        .values_list("password", "extra")
        .first()
    )
    if connection is not None:
        decrypt(connection[0] if connection[0] is not None else connection[1])
    secret = (
        WebhookEndpoint.objects.exclude(secret="")
        .order_by("-pk")
        .values_list("secret", flat=True)
        .first()
    )
    if secret is not None:
        decrypt(secret)
    value = (
        Variable.objects.filter(is_encrypted=True)
        .order_by("-pk")
        .values_list("val", flat=True)
        .first()
    )
    if value is not None:
        decrypt(value)
    # A watcher's broker password (`models.fields.PasswordEncryptedURLField`): reading the row
    # decrypts it.
    QueueWatcher.objects.filter(broker_url__contains=":fernet:").order_by("-pk").first()
