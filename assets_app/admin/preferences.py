"""Per-operator display preferences: the time zone the admin shows times in."""

import zoneinfo

from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from ..api.service_middleware import TIMEZONE_SESSION_KEY


def timezone_view(request):
    """GET: the choice; POST `timezone` (an IANA name, or empty for TIME_ZONE): stored in the
    session, then back to `next`."""
    zones = sorted(zoneinfo.available_timezones())
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = ""
    if request.method == "POST":
        name = request.POST.get("timezone", "").strip()
        if name and name not in zones:
            messages.error(request, f"Unknown time zone {name!r}.")
        else:
            if name:
                request.session[TIMEZONE_SESSION_KEY] = name
            else:
                request.session.pop(TIMEZONE_SESSION_KEY, None)
            messages.success(request, f"Times are now shown in {name or settings.TIME_ZONE}.")
            return HttpResponseRedirect(next_url or "/admin/")
    context = {
        **admin.site.each_context(request),
        "title": "Time zone",
        "zones": zones,
        "current": request.session.get(TIMEZONE_SESSION_KEY, ""),
        "default": settings.TIME_ZONE,
        "active": timezone.get_current_timezone_name(),
        "next": next_url,
    }
    return TemplateResponse(request, "admin/assets_app/timezone.html", context)
