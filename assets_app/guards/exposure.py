"""What the service insists on before it faces a network: loopback or not, and the first admin.

A service bound (`HOST`, `settings.BIND_HOST`) to anything but a loopback address is *exposed*:
the system checks (`guards/checks.py`) then refuse generated keys and DEBUG, and `ensure_superuser`
refuses to create an admin without a password set on purpose, a published one, or one Django's
password validators reject, and refuses to go on while a superuser still has a published
password.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError

from . import exceptions, keys

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (bracketed or not) and the names for them; anything else (0.0.0.0, ::,
    a hostname, a LAN address) may face a network."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposed() -> bool:
    return not is_loopback(settings.BIND_HOST)


@dataclass(frozen=True)
class AdminLogin:
    username: str
    # The password when this call created the user (printed once), else None.
    password: str | None
    generated: bool


def _refuse(message: str) -> exceptions.Conflict:
    return exceptions.Conflict(message, reason="insecure_admin_password")


def ensure_superuser(*, username: str, password: str | None) -> AdminLogin | None:
    """Create the first superuser if none exists; None when one exists already.

    On loopback a missing password is generated (random, returned once). Exposed, the password
    must be given and valid, and no existing superuser may still have a published password
    (`keys.PUBLISHED_VALUES`, e.g. the `admin` earlier versions created): Conflict otherwise,
    nothing created. Own implicit transaction (one INSERT)."""
    users = get_user_model().objects
    superusers = list(users.filter(is_superuser=True, is_active=True))
    if exposed():
        for user in superusers:
            if any(user.check_password(value) for value in keys.PUBLISHED_VALUES):
                raise _refuse(
                    f"superuser {user.get_username()!r} has a published password and HOST is "
                    f"{settings.BIND_HOST!r}; change it first (manage.py changepassword)"
                )
    if superusers:
        return None
    generated = password is None
    if exposed():
        if password is None:
            raise _refuse(
                f"HOST is {settings.BIND_HOST!r} (not loopback): set ADMIN_PASSWORD for the "
                "first superuser"
            )
        if password in keys.PUBLISHED_VALUES:
            raise _refuse("ADMIN_PASSWORD is a published password; choose another")
        try:
            validate_password(password)
        except ValidationError as exc:
            raise _refuse(f"ADMIN_PASSWORD is refused: {' '.join(exc.messages)}") from exc
    if generated:
        password = secrets.token_urlsafe(12)
    users.create_superuser(username=username, email="", password=password)
    return AdminLogin(username=username, password=password, generated=generated)
