"""Public API (DESIGN 6.2), mounted at /api/v2/."""

from ninja import Router

router = Router(tags=["public"])
