"""Settings for benchmark servers: the project's settings plus opt-in instrumentation.

`DJANGO_SETTINGS_MODULE=bench.settings_bench` changes nothing unless `BENCH_LOCKMETER_FILE` is
set; then every request is wrapped by `bench.lockmeter.LockMeterMiddleware`, which appends one
JSON line per request (TI lock hold, statements) to that file.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import MIDDLEWARE

if os.environ.get("BENCH_LOCKMETER_FILE"):
    MIDDLEWARE = ["bench.lockmeter.LockMeterMiddleware", *MIDDLEWARE]
