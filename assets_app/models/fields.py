"""Model fields of the service's own (issue 38)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django import forms
from django.db import models

from ..guards import encryption

TOKEN_PREFIX = "fernet:"


def hide_password(url: str) -> str:
    """`url` with its userinfo password replaced by `fernet:<token>` (Fernet, FERNET_KEY), as
    it is stored; a URL without a password, or already hidden, as it is."""
    parts = urlsplit(url)
    if parts.password is None or parts.password.startswith(TOKEN_PREFIX):
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    token = encryption.encrypt(parts.password)
    netloc = f"{user}:{TOKEN_PREFIX}{token}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def reveal_password(url: str) -> str:
    """The stored URL with its password decrypted (`SecretsUnreadable` under a FERNET_KEY that
    cannot read it); a URL stored clear (before issue 38) as it is."""
    parts = urlsplit(url)
    if parts.password is None or not parts.password.startswith(TOKEN_PREFIX):
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    password = encryption.decrypt(parts.password[len(TOKEN_PREFIX) :])
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{hostport}"))


class PasswordEncryptedURLField(models.TextField):
    """A URL (a watcher's broker URL) whose password is stored Fernet-encrypted, as Connections'
    passwords are, and read back clear: the ORM, the admin and the consumer see the URL, the
    database holds `amqp://user:fernet:<token>@host/vhost`. The scheme, user and host stay
    readable (the row's check constraint reads the scheme). Text in the database (a token is
    longer than the password); forms and definitions keep `max_length` on what is typed."""

    def __init__(self, *args: Any, max_length: int | None = None, **kwargs: Any) -> None:
        self.typed_max_length = max_length
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        if self.typed_max_length is not None:
            kwargs["max_length"] = self.typed_max_length
        return name, path, args, kwargs

    def from_db_value(self, value, expression, connection):
        return value if value is None else reveal_password(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if not value else hide_password(value)

    def formfield(self, **kwargs):
        return super().formfield(
            **{"form_class": forms.CharField, "max_length": self.typed_max_length, **kwargs}
        )
