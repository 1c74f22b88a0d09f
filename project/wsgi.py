import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = get_wsgi_application()
# Load the URLconf (and with it the API's views and models) now, then move everything loaded so
# far out of the cyclic garbage collector's generations (`gc.freeze`): a full collection in a
# web worker otherwise walks the whole startup heap (~50 ms on this machine, one every few
# hundred 300-outlet successes), and its writes to object headers unshare a forked process's
# pages. bench: GC CPU over 800 sequential successes 73.7 -> 22.1 ms in one gunicorn worker.
get_resolver().url_patterns  # noqa: B018 (imports the URLconf)
gc.freeze()
