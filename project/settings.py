"""Settings for the asset event service: one module, every value from the environment.

Every setting read here is documented, with its default, in `.env.example`.
"""

import sys
from pathlib import Path

import environ

from assets_app.guards import keys

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Keys: configured (environment or .env), else generated once and kept under KEY_DIR (0600, the
# same for every process of this installation; assets_app/guards/keys.py). None is in the
# repository.
KEY_DIR = Path(env.str("KEY_DIR", default=str(BASE_DIR / "var" / "keys")))
# The settings whose value the service generated (a service exposed beyond loopback refuses to
# start with any: assets_app/guards/checks.py).
GENERATED_KEYS: list[str] = []


def _key(setting: str) -> str:
    configured = env.str(setting, default="")
    if configured:
        return configured
    GENERATED_KEYS.append(setting)
    return keys.generated_key(setting.lower(), directory=KEY_DIR)


SECRET_KEY = _key("SECRET_KEY")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# The address bin/serve binds (HOST). Anything but loopback is "exposed": the system checks then
# require configured keys and DEBUG off, and bootstrap_admin a configured, valid password.
BIND_HOST = env.str("HOST", default="127.0.0.1")

# Behind TLS (production, see .env.example): what `manage.py check --deploy` asks for.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
# A TLS-terminating proxy in front sets this header (e.g. X-Forwarded-Proto: https).
if env.bool("SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Load balancers and workers probe these over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before django_q: its `qcluster` command is replaced by assets_app's (fewer checks, a
    # lighter cluster: assets_app/management/commands/qcluster.py).
    "assets_app",
    "django_q",
]

MIDDLEWARE = [
    # First, so the worker API latency histogram (/metrics) times the whole stack.
    "assets_app.api.service_middleware.WorkerApiLatencyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A view that fails because the database is full or away: 503 + Retry-After, not a 500.
    "assets_app.api.service_middleware.DatabaseUnavailableMiddleware",
    # Before anything reads the body: oversized (413) and non-JSON (415) API requests.
    "assets_app.api.middleware.ApiRequestGuardMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "assets_app.api.service_middleware.OperatorTimezoneMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last (its process_view runs the view): the console's lists and the public API's GETs read
    # the replica when DATABASE_REPLICA_URL is set; a write pins its client to the primary.
    "assets_app.api.service_middleware.ReplicaReadsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

DATABASE_POOL_MIN_SIZE = env.int("DATABASE_POOL_MIN_SIZE", default=1)
DATABASE_POOL_MAX_SIZE = env.int("DATABASE_POOL_MAX_SIZE", default=4)
DATABASE_POOL_TIMEOUT_SECONDS = env.float("DATABASE_POOL_TIMEOUT_SECONDS", default=3.0)
# SQLite by default so the demo runs anywhere; PostgreSQL when DATABASE_URL says so. The
# concurrency guarantees (SKIP LOCKED claims, row locks) are claimed for PostgreSQL only.
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    (BASE_DIR / "var").mkdir(exist_ok=True)
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            # WAL lets the web server and the django-q2 cluster read while one of them writes;
            # IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
else:
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    # Prepared statements for the success path's few fixed statements (`sql.prepared_cursor`,
    # issue 14): psycopg prepares one on a connection after this many executions of it.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "prepare_threshold", env.int("DATABASE_PREPARE_THRESHOLD", default=2)
    )
    # The web processes (gunicorn imports project.wsgi, which loads these settings) keep a pool
    # of connections each (psycopg_pool, as Django 5.2 supports it): a request waits at most
    # DATABASE_POOL_TIMEOUT_SECONDS for one, then gets a 503 with Retry-After (api/errors.py).
    # Sizes per process: see .env.example. Commands connect plainly (a pool only hides a "does
    # not exist" behind a timeout there); the django-q2 cluster never pools: it forks its workers
    # after using the database, and a pool (its sockets and threads) does not survive a fork.
    _web_process = "project.wsgi" in sys.modules
    _cluster = sys.argv[1:2] == ["qcluster"]
    if env.bool("DATABASE_POOL", default=_web_process) and not _cluster:
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps the connections
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": DATABASE_POOL_MIN_SIZE,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": DATABASE_POOL_TIMEOUT_SECONDS,
        }
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
# A streaming standby of DATABASE_URL (issue 46, assets_app/sql/replica.py; README "Read
# replica"): the console's list pages, lineage and grid and the public API's GETs read it, with
# the same connection options as the primary; everything else, and every write, uses the primary.
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
if DATABASE_REPLICA_URL:
    _replica = env.db_url_config(DATABASE_REPLICA_URL)
    for _name in ("CONN_HEALTH_CHECKS", "CONN_MAX_AGE"):
        if _name in DATABASES["default"]:
            _replica.setdefault(_name, DATABASES["default"][_name])
    _replica.setdefault("OPTIONS", {}).update(DATABASES["default"].get("OPTIONS", {}))
    # Tests: the replica alias is the test database itself (the standby test adds its own).
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
    DATABASE_ROUTERS = ["assets_app.sql.routers.ReplicaRouter"]
# Above this lag (seconds behind the primary) reads go to the primary.
DATABASE_REPLICA_MAX_LAG_SECONDS = env.float("DATABASE_REPLICA_MAX_LAG_SECONDS", default=10.0)
# After a write, the writer's reads stay on the primary this long (a cookie; read-your-writes).
DATABASE_REPLICA_PIN_SECONDS = env.float("DATABASE_REPLICA_PIN_SECONDS", default=15.0)
# How often a process asks the standby its lag, and waits after it failed before trying again.
DATABASE_REPLICA_CHECK_SECONDS = env.float("DATABASE_REPLICA_CHECK_SECONDS", default=1.0)
DATABASE_REPLICA_RETRY_SECONDS = env.float("DATABASE_REPLICA_RETRY_SECONDS", default=5.0)
# Off (False) behind a transaction-pooling PgBouncer, which cannot keep prepared statements.
DATABASE_PREPARED_STATEMENTS = env.bool("DATABASE_PREPARED_STATEMENTS", default=True)
# What a client is told (Retry-After, seconds) when the database is full or away: 503.
DATABASE_RETRY_AFTER_SECONDS = env.int("DATABASE_RETRY_AFTER_SECONDS", default=5)
# GET /api/v2/.../dagRuns/{id}/wait (assets_app/catalog/run_waits.py): a stream ends after
# RUN_WAIT_MAX_SECONDS; at most RUN_WAIT_MAX_CONCURRENT streams at once per server (file locks
# under RUN_WAIT_SLOT_DIR, shared by the host's web workers), beyond them 503 + Retry-After.
RUN_WAIT_MAX_SECONDS = env.float("RUN_WAIT_MAX_SECONDS", default=10.0)
RUN_WAIT_MAX_CONCURRENT = env.int("RUN_WAIT_MAX_CONCURRENT", default=1)
# The web workers bin/serve starts (its WEB_WORKERS, 2 by default): the wait slots must stay below.
WEB_WORKERS = env.int("WEB_WORKERS", default=2)
RUN_WAIT_SLOT_DIR = Path(env.str("RUN_WAIT_SLOT_DIR", default=str(BASE_DIR / "var" / "wait-slots")))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
# The zone admin pages show times in (each operator may choose another on /admin/timezone/).
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True
# Admin dates as "2026-11-30 08:25:55" (assets_app/formats/en/formats.py).
FORMAT_MODULE_PATH = ["assets_app.formats"]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# bin/serve fills it (collectstatic); it exists from the start so whitenoise never warns.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Bodies over this size get 413 before any parsing (DESIGN 4.10).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("MAX_REQUEST_BODY_BYTES", default=10 * 1024 * 1024)

# --- Asset event service -------------------------------------------------------------------
# "queue" (default): success writes one outbox row; the drain registers events.
# "inline": success registers events in its own transaction before taking the TI lock.
ASSET_REGISTRATION_MODE = env.str("ASSET_REGISTRATION_MODE", default="queue")
ASSET_QUEUE_BATCH_SIZE = env.int("ASSET_QUEUE_BATCH_SIZE", default=500)
# Outlets one drain transaction registers (batches are sized by it; bigger rows are chunked).
# 5,000 rather than 10,000: the 500-burst's cluster peak PSS 269-311 -> 241-255 MB, and its
# registration no slower (15.7-16.6 s after the last answer against 15.0-17.0; bench/burst.py).
ASSET_QUEUE_BATCH_OUTLETS = env.int("ASSET_QUEUE_BATCH_OUTLETS", default=5_000)
ASSET_QUEUE_MAX_ATTEMPTS = env.int("ASSET_QUEUE_MAX_ATTEMPTS", default=10)
ASSET_QUEUE_BACKOFF_BASE_SECONDS = env.float("ASSET_QUEUE_BACKOFF_BASE_SECONDS", default=2.0)
ASSET_QUEUE_BACKOFF_CAP_SECONDS = env.float("ASSET_QUEUE_BACKOFF_CAP_SECONDS", default=600.0)
# Time schedules (issue 24): Dags one time-scheduler transaction claims, and the runs it creates
# for one Dag at most in a pass (a catchup of more goes on in the next passes).
TIME_SCHEDULER_BATCH_SIZE = env.int("TIME_SCHEDULER_BATCH_SIZE", default=200)
TIME_SCHEDULER_RUNS_PER_DAG = env.int("TIME_SCHEDULER_RUNS_PER_DAG", default=100)
# Airflow's Dag processor parses each file again every `min_file_process_interval` (30 s) and
# stores its Dags' next runs again: a stored next run due for longer is the one that parse
# stores (issue 40, `definitions.next_runs.reparse`).
TIME_SCHEDULER_PARSE_INTERVAL_SECONDS = env.float(
    "TIME_SCHEDULER_PARSE_INTERVAL_SECONDS", default=30.0
)
# One drain or scheduler invocation keeps working until its queue is empty or this budget is spent.
ASSET_DRAIN_TIME_BUDGET_SECONDS = env.float("ASSET_DRAIN_TIME_BUDGET_SECONDS", default=20.0)
# The drain yields to a burst of successes (drain._Pacer): while more than this many per second
# arrive and wait undrained, for at most ASSET_DRAIN_YIELD_MAX_SECONDS in a row; 0: never.
ASSET_DRAIN_YIELD_ABOVE_PER_SECOND = env.float("ASSET_DRAIN_YIELD_ABOVE_PER_SECOND", default=40.0)
ASSET_DRAIN_YIELD_MAX_SECONDS = env.float("ASSET_DRAIN_YIELD_MAX_SECONDS", default=5.0)
# Niceness the cluster's workers add to themselves when they run the drain or the scheduler
# (off by default: on a host busy with other work it starves the drain, see .env.example).
ASSET_DRAIN_NICE = env.int("ASSET_DRAIN_NICE", default=0)
# /healthz fails when the drain or scheduler has not succeeded for this long (the django-q2
# sweep runs each of them every minute).
ASSET_HEALTH_MAX_AGE_SECONDS = env.int("ASSET_HEALTH_MAX_AGE_SECONDS", default=180)
# For this long after a web process starts, a drain or scheduler not seen yet (or last seen
# before the start) is "starting", not a failure: the cluster's first sweep comes within a minute.
ASSET_HEALTH_STARTUP_GRACE_SECONDS = env.int("ASSET_HEALTH_STARTUP_GRACE_SECONDS", default=90)
# Retention (issue 30, assets_app/operations/retention.py; README "Retention"): how long each kind
# of history row is kept, the runs always kept per Dag, and the periodic clean (off by default:
# deleting history is irreversible, so an operator turns it on after choosing the policy).
RETENTION_RUN_DAYS = env.float("RETENTION_RUN_DAYS", default=90.0)
RETENTION_KEEP_LAST_RUNS = env.int("RETENTION_KEEP_LAST_RUNS", default=10)
RETENTION_XCOM_DAYS = env.float("RETENTION_XCOM_DAYS", default=30.0)
RETENTION_EVENT_DAYS = env.float("RETENTION_EVENT_DAYS", default=90.0)
RETENTION_AUDIT_DAYS = env.float("RETENTION_AUDIT_DAYS", default=365.0)
# Webhook messages delivered or failed (never a pending one), with their attempts.
RETENTION_WEBHOOK_DAYS = env.float("RETENTION_WEBHOOK_DAYS", default=30.0)
RETENTION_BATCH_SIZE = env.int("RETENTION_BATCH_SIZE", default=500)
RETENTION_SLEEP_RATIO = env.float("RETENTION_SLEEP_RATIO", default=3.0)
RETENTION_EXPORT_DIR = env.str("RETENTION_EXPORT_DIR", default="")
RETENTION_PERIODIC = env.bool("RETENTION_PERIODIC", default=False)
RETENTION_INTERVAL_MINUTES = env.float("RETENTION_INTERVAL_MINUTES", default=60.0)
RETENTION_TIME_BUDGET_SECONDS = env.float("RETENTION_TIME_BUDGET_SECONDS", default=30.0)
# Events out (issue 29, assets_app/events_out/): outgoing
# webhooks and freshness policies. The SSRF guard refuses loopback, private, link-local and
# metadata addresses unless a host name or CIDR here names them.
WEBHOOK_ALLOWED_HOSTS = env.list("WEBHOOK_ALLOWED_HOSTS", default=[])
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=10.0)
# Retries: full-jitter exponential backoff from BASE, capped at CAP, until MAX_AGE after the
# message was written (about three days); a Retry-After up to CAP is honoured.
WEBHOOK_BACKOFF_BASE_SECONDS = env.float("WEBHOOK_BACKOFF_BASE_SECONDS", default=5.0)
WEBHOOK_BACKOFF_CAP_SECONDS = env.float("WEBHOOK_BACKOFF_CAP_SECONDS", default=6 * 3600.0)
WEBHOOK_MAX_AGE_SECONDS = env.float("WEBHOOK_MAX_AGE_SECONDS", default=3 * 86400.0)
WEBHOOK_MAX_IN_FLIGHT = env.int("WEBHOOK_MAX_IN_FLIGHT", default=4)
WEBHOOK_BATCH_SIZE = env.int("WEBHOOK_BATCH_SIZE", default=100)
WEBHOOK_TIME_BUDGET_SECONDS = env.float("WEBHOOK_TIME_BUDGET_SECONDS", default=40.0)
# During a secret rotation the old secret signs too (two signatures) for this long.
WEBHOOK_SECRET_OVERLAP_SECONDS = env.float("WEBHOOK_SECRET_OVERLAP_SECONDS", default=86400.0)
FRESHNESS_BATCH_SIZE = env.int("FRESHNESS_BATCH_SIZE", default=1000)
# Queue watchers (issue 28, assets_app/watchers/messages.py, `manage.py watch_queues`): the RabbitMQ
# URL a watcher with an empty broker_url connects to; the consumer's periodic check (queue depth,
# the watcher rows re-read) every CHECK seconds; reconnects back off from BASE doubling to CAP.
ASSET_WATCHER_BROKER_URL = env.str(
    "ASSET_WATCHER_BROKER_URL", default="amqp://guest:guest@localhost:5672/%2F"
)
ASSET_WATCHER_CHECK_SECONDS = env.float("ASSET_WATCHER_CHECK_SECONDS", default=10.0)
ASSET_WATCHER_RECONNECT_BASE_SECONDS = env.float(
    "ASSET_WATCHER_RECONNECT_BASE_SECONDS", default=0.5
)
ASSET_WATCHER_RECONNECT_CAP_SECONDS = env.float("ASSET_WATCHER_RECONNECT_CAP_SECONDS", default=30.0)
WORKER_API_KEY = _key("WORKER_API_KEY")
# The deploy key: the bearer key of `POST /execution/dags/sync` (bin/airflow-worker sends it),
# beside API tokens whose user holds add_dag and change_dag. The worker key above only claims
# work. Unset: generated once under KEY_DIR like the others (not listed in GENERATED_KEYS: an
# exposed service may keep a generated one, only the hosts that read KEY_DIR know it).
DAG_SYNC_KEY = env.str("DAG_SYNC_KEY", default="") or keys.generated_key(
    "dag_sync_key", directory=KEY_DIR
)
# Airflow's [core] dags_are_paused_at_creation: a Dag a sync creates is paused unless its
# definition says `is_paused` (a DAG file: is_paused_upon_creation). Existing Dags keep theirs.
DAGS_ARE_PAUSED_AT_CREATION = env.bool("DAGS_ARE_PAUSED_AT_CREATION", default=True)
WORKER_TOKEN_LIFETIME_SECONDS = env.int("WORKER_TOKEN_LIFETIME_SECONDS", default=3600)
# Login (issue 49): `POST /auth/token` and `/auth/token/cli` answer a JWT signed with JWT_SECRET
# (Airflow's [api_auth] jwt_secret; its own key, so no worker token is ever a user token), valid
# for JWT_EXPIRATION_TIME seconds (/auth/token/cli: JWT_CLI_EXPIRATION_TIME), Airflow's defaults.
JWT_SECRET = _key("JWT_SECRET")
JWT_EXPIRATION_TIME = env.int("JWT_EXPIRATION_TIME", default=86400)
JWT_CLI_EXPIRATION_TIME = env.int("JWT_CLI_EXPIRATION_TIME", default=3600)
JWT_AUDIENCE = env.str("JWT_AUDIENCE", default="apache-airflow")
JWT_LEEWAY_SECONDS = env.int("JWT_LEEWAY_SECONDS", default=10)
# Failed logins: after LOGIN_FAILURE_LIMIT failures for one username, or from one client address,
# within LOGIN_FAILURE_WINDOW_SECONDS, further attempts are refused (429) until older ones age out.
LOGIN_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_FAILURE_WINDOW_SECONDS = env.int("LOGIN_FAILURE_WINDOW_SECONDS", default=300)
# Fernet key (urlsafe base64, 32 bytes) Connection passwords and extras are encrypted with; a
# comma-separated list decrypts with every key and encrypts with the first (key rotation). Unset:
# a key is generated once and kept in FERNET_KEY_FILE.
FERNET_KEY = env.str("FERNET_KEY", default="")
FERNET_KEY_FILE = env.path("FERNET_KEY_FILE", default=BASE_DIR / "var" / "fernet.key")
# A claimed TI that is not started within this many seconds can be claimed again.
WORKLOAD_CLAIM_TIMEOUT_SECONDS = env.int("WORKLOAD_CLAIM_TIMEOUT_SECONDS", default=300)
# A running TI whose heartbeat stopped this long ago is failed (or retried) by the scheduler's
# sweep (Airflow's `[scheduler] task_instance_heartbeat_timeout`).
TASK_HEARTBEAT_TIMEOUT_SECONDS = env.float("TASK_HEARTBEAT_TIMEOUT_SECONDS", default=300)
# A triggerer holds the triggers it claimed this long past its last claim call (it renews
# them every second or so); a triggerer that died loses them to another after this (issue 42;
# Airflow's triggerers take over a dead one's after `[triggerer] triggerer_health_check_threshold`).
TRIGGER_LEASE_SECONDS = env.float("TRIGGER_LEASE_SECONDS", default=30)
# A Dag callback request (issue 39) a bin/airflow-worker claimed is due again this long after
# the claim when no report came (the worker died mid-callback); one claimed this many times
# without a report is parked for an operator.
DAG_CALLBACK_LEASE_SECONDS = env.float("DAG_CALLBACK_LEASE_SECONDS", default=300)
DAG_CALLBACK_MAX_ATTEMPTS = env.int("DAG_CALLBACK_MAX_ATTEMPTS", default=5)
# How often the repair timer looks (assets_app/timers/service.py).
TASK_REPAIR_INTERVAL_SECONDS = env.float("TASK_REPAIR_INTERVAL_SECONDS", default=60)
# A finished TI's token reads Connections this long after (its callbacks; Airflow's
# `[core] task_success_overtime`); `assets_app/runtime/scopes.py`.
TASK_SUCCESS_OVERTIME_SECONDS = env.float("TASK_SUCCESS_OVERTIME_SECONDS", default=20)
# The largest task or asset state value (bytes of JSON) the public API stores, 0 = no limit
# (Airflow's `[state_store] max_value_storage_bytes`; a worker's write is held only to the body
# limit, as Airflow's); `assets_app/runtime/state_store.py`.
STATE_STORE_MAX_VALUE_BYTES = env.int("STATE_STORE_MAX_VALUE_BYTES", default=65535)
# The expiry the public API gives a task state key written with `expires_at: "default"` (days;
# 0 = never; Airflow's `[state_store] default_retention_days`, 30).
STATE_STORE_DEFAULT_RETENTION_DAYS = env.int("STATE_STORE_DEFAULT_RETENTION_DAYS", default=30)
# Task logs workers ship (PUT /execution/task-instances/{id}/logs/{try}): bytes per chunk, and
# bytes kept per try (a chunk beyond it is refused, 413 log_too_large).
TASK_LOG_CHUNK_MAX_BYTES = env.int("TASK_LOG_CHUNK_MAX_BYTES", default=256 * 1024)
TASK_LOG_MAX_BYTES = env.int("TASK_LOG_MAX_BYTES", default=10 * 1024 * 1024)
# Dynamic task mapping (issue 25): the longest value a task may push for a mapped downstream to
# expand over (Airflow's `[core] max_map_length`, same default); a longer push is refused, 400
# unmappable_return_value_length, as Airflow's execution API does.
MAX_MAP_LENGTH = env.int("MAX_MAP_LENGTH", default=1024)

# The timers process (issue 41, assets_app/timers/): a timer looks at least this often whatever
# it expects (a lost wake-up), and on SQLite (no NOTIFY) every TIMERS_POLL_SECONDS.
TIMERS_MAX_WAIT_SECONDS = env.float("TIMERS_MAX_WAIT_SECONDS", default=300.0)
TIMERS_POLL_SECONDS = env.float("TIMERS_POLL_SECONDS", default=2.0)
# Niceness the timers' background children (webhook delivery and freshness; retention and
# repair) add to themselves, so that the time scheduler's child and the web get the cores first.
TIMERS_BACKGROUND_NICE = env.int("TIMERS_BACKGROUND_NICE", default=5)
# How many children of the timers process run the time scheduler (they share a tick's due Dags,
# SKIP LOCKED, batch by batch).
TIMERS_TIME_PROCESSES = env.int("TIMERS_TIME_PROCESSES", default=2)

# PostgreSQL: how long an idle cluster waits for a NOTIFY before it looks at the queue anyway
# (a lost notification). A task taken by a cluster that died sends none when its lock expires
# (Q_CLUSTER_RETRY after its start): the wait ends at the earliest such expiry.
# Each empty look is 3 queries (Django's connection health check, the queue SELECT, the earliest
# taken lock): an idle cluster makes about 3 / this queries a second (issue 41: 30 s, the idle
# target with the timers and the watchers beside it; 5 s made it 1.7 transactions/s alone).
Q_CLUSTER_IDLE_WAIT_SECONDS = env.float("Q_CLUSTER_IDLE_WAIT_SECONDS", default=30.0)
# django-q2: ORM broker on the default database. Each task's timeout stays below `retry` so the
# broker never redelivers a task that is still running (DESIGN 7).
Q_CLUSTER = {
    "name": "asset-events",
    "orm": "default",
    "workers": env.int("Q_CLUSTER_WORKERS", default=2),
    "timeout": env.int("Q_CLUSTER_TIMEOUT", default=60),
    "retry": env.int("Q_CLUSTER_RETRY", default=90),
    "max_attempts": 1,
    # The ORM broker, woken by NOTIFY on PostgreSQL (assets_app/cluster/broker.py): a task is picked
    # up when its enqueue commits, and an idle cluster looks once per Q_CLUSTER_IDLE_WAIT_SECONDS.
    # `django_q.brokers.orm.ORM` is django-q2's own, polling every Q_CLUSTER_POLL (92
    # transactions/s idle, issue 15).
    "broker_class": env.str(
        "Q_CLUSTER_BROKER_CLASS", default="assets_app.cluster.broker.ListeningORM"
    ),
    # SQLite only (no NOTIFY there): how often an idle cluster asks the broker for work.
    "poll": env.float("Q_CLUSTER_POLL", default=0.02),
    "catch_up": False,
    # Successful tasks are not stored (a drain or scheduler run leaves its heartbeat instead:
    # the dashboard and /healthz): storing each was 4 statements, a minute's sweeps 16 on an
    # idle service. Failed tasks are stored whatever this says (django-q2).
    "save_limit": -1,
    "ack_failures": True,
    "label": "Django Q2",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {
        # A request the database could not take: one warning line, not a traceback.
        "database_unavailable": {"()": "assets_app.sql.errors.QuietDatabaseUnavailable"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # pika logs every connection step at INFO; the watchers log their own connects.
        "pika": {"level": "WARNING"},
        "django.request": {"filters": ["database_unavailable"]},
    },
}
