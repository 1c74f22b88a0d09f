"""gunicorn's logger for bin/serve: every access line except workers' successful claim polls.

Each reference worker polls POST /execution/workloads/claim several times a second, so with the
default access log those lines drown everything else on the console. A claim that fails (4xx,
5xx) is still logged, and every other request is logged as gunicorn logs it.
"""

from gunicorn.glogging import Logger

QUIET_PATHS = frozenset({"/execution/workloads/claim"})


class QuietClaimsLogger(Logger):
    def access(self, resp, req, environ, request_time):
        status = getattr(resp, "status_code", None) or int(str(resp.status).split()[0])
        if req.path in QUIET_PATHS and status < 400:
            return
        super().access(resp, req, environ, request_time)
