"""Public API tokens: a key shown once, stored as its hash."""

import hashlib
import secrets

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A bearer token for the public API (`/api/v2/`), acting as its user. Only a hash is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=200)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @staticmethod
    def generate_key() -> str:
        return secrets.token_urlsafe(32)


class RevokedToken(models.Model):
    """A login token (JWT, `operations.logins`) ended by `GET /api/v2/auth/logout` before its
    expiry: Airflow 3.3.2's `revoked_token` table (its `jti`, kept until its `exp`)."""

    jti = models.CharField(max_length=32, primary_key=True)
    exp = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return self.jti
