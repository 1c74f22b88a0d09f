"""Domain exceptions: a short machine `reason` and a human `message`.

Domain modules raise these; `api/errors.py` maps them to HTTP in one place and management commands
print them as `CommandError`s.
"""

from typing import Any


class DomainError(Exception):
    """Base of every expected failure. `extra` is merged into the API error body's `detail`."""

    reason = "error"

    def __init__(self, message: str, *, reason: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.extra = extra


class NotFound(DomainError):
    reason = "not_found"


class InvalidState(DomainError):
    """The object is not in a state that allows the change (HTTP 409)."""

    reason = "invalid_state"


class StaleTry(InvalidState):
    """A worker token of another try than the TI's current one (invariant 12, HTTP 409)."""

    reason = "stale_try"

    @classmethod
    def of(cls, *, ti_id: Any, token_try: int, current_try: int) -> "StaleTry":
        return cls(
            f"this token is for try {token_try} of task instance {ti_id}, which is at try "
            f"{current_try} now: the token is stale and changes nothing",
            token_try_number=token_try,
            current_try_number=current_try,
        )


class Conflict(DomainError):
    reason = "conflict"


class InvalidInput(DomainError):
    """Well-formed but unacceptable input (HTTP 422)."""

    reason = "invalid_input"


class TooLarge(DomainError):
    """A body or a total beyond a configured bound (HTTP 413)."""

    reason = "too_large"


class BadRequest(DomainError):
    """A request the API refuses as a whole, e.g. an unknown `order_by` attribute (HTTP 400)."""

    reason = "bad_request"


class PermissionDenied(DomainError):
    reason = "forbidden"


class NotAuthenticated(DomainError):
    reason = "not_authenticated"


class Unavailable(DomainError):
    """The service cannot answer because of its own configuration (HTTP 503), e.g. a Fernet key
    that does not decrypt what is stored."""

    reason = "unavailable"
