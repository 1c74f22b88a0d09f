"""Worker API (DESIGN 6.1), mounted at /execution/."""

from ninja import Router

router = Router(tags=["execution"])
