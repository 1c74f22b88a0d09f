"""System checks of the service's settings (registered in `apps.AssetsAppConfig.ready`).

Every setting with a rule has one check here, with an id and a message naming the setting, its
value and what is allowed, so a typo stops `manage.py check`, `migrate` (and so `bin/serve`)
instead of silently running something else. `check --deploy` adds the rules for a service that
faces a network. Ids:

- E001-E099: value rules of the asset service's settings (`SETTING_RULES`).
- E101-E104: keys and exposure (published keys, generated keys or DEBUG beyond loopback).
- W105: (deploy) a worker key too short to resist guessing.
- E106: beyond loopback, a key (SECRET_KEY, WORKER_API_KEY, DAG_SYNC_KEY, JWT_SECRET) shorter than
  MIN_KEY_LENGTH, refused as a published one is (issue 26).
- E107: two of those keys equal (always); E108: beyond loopback, a key of fewer than
  MIN_KEY_DISTINCT_CHARACTERS different characters; E109: a malformed FERNET_KEY (issue 38).
- E110: a published JWT_SECRET (the login tokens' key, issue 49; E106-E108 and E103 cover it as
  the other keys).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks

from . import encryption, exposure, keys

REGISTRATION_MODES = ("queue", "inline")
MIN_WORKER_API_KEY_LENGTH = 32
# Beyond loopback every key must have at least this many characters (a generated one has 64).
MIN_KEY_LENGTH = 32
# ... and at least this many different characters (issue 38: 32 identical ones passed); a random
# 32-character url-safe key has about 25.
MIN_KEY_DISTINCT_CHARACTERS = 8
EXPOSED_KEYS = ("SECRET_KEY", "WORKER_API_KEY", "DAG_SYNC_KEY", "JWT_SECRET")


@dataclass(frozen=True)
class Rule:
    id: str
    setting: str
    allowed: str  # how the message describes the allowed values
    ok: Callable[[Any], bool]
    value: Callable[[], Any]


def _setting(name: str) -> Callable[[], Any]:
    return lambda: getattr(settings, name)


def _cluster(key: str) -> Callable[[], Any]:
    return lambda: settings.Q_CLUSTER.get(key)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def _not_negative(value: Any) -> bool:
    return isinstance(value, int | float) and value >= 0


def _budget_below_timeout(budget: Any) -> bool:
    return _positive(budget) and budget < settings.Q_CLUSTER["timeout"]


def _timeout_below_retry(timeout: Any) -> bool:
    return _positive(timeout) and timeout < settings.Q_CLUSTER["retry"]


def _cap_at_least_base(cap: Any) -> bool:
    return _positive(cap) and cap >= settings.ASSET_QUEUE_BACKOFF_BASE_SECONDS


def _pool_max_ok(value: Any) -> bool:
    return isinstance(value, int) and value >= max(1, settings.DATABASE_POOL_MIN_SIZE)


SETTING_RULES = (
    Rule(
        "assets_app.E001",
        "ASSET_REGISTRATION_MODE",
        "one of " + ", ".join(repr(m) for m in REGISTRATION_MODES),
        lambda v: v in REGISTRATION_MODES,
        _setting("ASSET_REGISTRATION_MODE"),
    ),
    Rule(
        "assets_app.E002",
        "ASSET_QUEUE_BATCH_SIZE",
        "a whole number >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("ASSET_QUEUE_BATCH_SIZE"),
    ),
    Rule(
        "assets_app.E003",
        "ASSET_QUEUE_BATCH_OUTLETS",
        "a whole number >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("ASSET_QUEUE_BATCH_OUTLETS"),
    ),
    Rule(
        "assets_app.E004",
        "ASSET_QUEUE_MAX_ATTEMPTS",
        "a whole number >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("ASSET_QUEUE_MAX_ATTEMPTS"),
    ),
    Rule(
        "assets_app.E005",
        "ASSET_QUEUE_BACKOFF_BASE_SECONDS",
        "a number of seconds > 0",
        _positive,
        _setting("ASSET_QUEUE_BACKOFF_BASE_SECONDS"),
    ),
    Rule(
        "assets_app.E006",
        "ASSET_QUEUE_BACKOFF_CAP_SECONDS",
        "a number of seconds >= ASSET_QUEUE_BACKOFF_BASE_SECONDS",
        _cap_at_least_base,
        _setting("ASSET_QUEUE_BACKOFF_CAP_SECONDS"),
    ),
    Rule(
        "assets_app.E007",
        "ASSET_DRAIN_TIME_BUDGET_SECONDS",
        "a number of seconds > 0 and below Q_CLUSTER_TIMEOUT (or drains are killed mid-batch)",
        _budget_below_timeout,
        _setting("ASSET_DRAIN_TIME_BUDGET_SECONDS"),
    ),
    Rule(
        "assets_app.E008",
        "Q_CLUSTER_TIMEOUT",
        "a number of seconds > 0 and below Q_CLUSTER_RETRY (or the broker redelivers running "
        "tasks)",
        _timeout_below_retry,
        _cluster("timeout"),
    ),
    Rule(
        "assets_app.E009",
        "Q_CLUSTER_WORKERS",
        "a whole number >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _cluster("workers"),
    ),
    Rule(
        "assets_app.E010",
        "Q_CLUSTER_POLL",
        "a number of seconds > 0",
        _positive,
        _cluster("poll"),
    ),
    Rule(
        "assets_app.E011",
        "ASSET_DRAIN_YIELD_ABOVE_PER_SECOND",
        "a number >= 0 (0: never yield)",
        _not_negative,
        _setting("ASSET_DRAIN_YIELD_ABOVE_PER_SECOND"),
    ),
    Rule(
        "assets_app.E012",
        "ASSET_DRAIN_YIELD_MAX_SECONDS",
        "a number of seconds >= 0 (0: never yield)",
        _not_negative,
        _setting("ASSET_DRAIN_YIELD_MAX_SECONDS"),
    ),
    Rule(
        "assets_app.E013",
        "ASSET_DRAIN_NICE",
        "a whole number from 0 to 19",
        lambda v: isinstance(v, int) and 0 <= v <= 19,
        _setting("ASSET_DRAIN_NICE"),
    ),
    Rule(
        "assets_app.E014",
        "ASSET_HEALTH_MAX_AGE_SECONDS",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("ASSET_HEALTH_MAX_AGE_SECONDS"),
    ),
    Rule(
        "assets_app.E015",
        "ASSET_HEALTH_STARTUP_GRACE_SECONDS",
        "a whole number of seconds >= 0",
        lambda v: isinstance(v, int) and v >= 0,
        _setting("ASSET_HEALTH_STARTUP_GRACE_SECONDS"),
    ),
    Rule(
        "assets_app.E016",
        "WORKER_TOKEN_LIFETIME_SECONDS",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("WORKER_TOKEN_LIFETIME_SECONDS"),
    ),
    Rule(
        "assets_app.E017",
        "WORKLOAD_CLAIM_TIMEOUT_SECONDS",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("WORKLOAD_CLAIM_TIMEOUT_SECONDS"),
    ),
    Rule(
        "assets_app.E018",
        "DATABASE_POOL_MAX_SIZE",
        "a whole number >= 1 and >= DATABASE_POOL_MIN_SIZE",
        _pool_max_ok,
        _setting("DATABASE_POOL_MAX_SIZE"),
    ),
    Rule(
        "assets_app.E019",
        "DATABASE_POOL_TIMEOUT_SECONDS",
        "a number of seconds > 0",
        _positive,
        _setting("DATABASE_POOL_TIMEOUT_SECONDS"),
    ),
    Rule(
        "assets_app.E020",
        "DATABASE_RETRY_AFTER_SECONDS",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("DATABASE_RETRY_AFTER_SECONDS"),
    ),
    Rule(
        "assets_app.E021",
        "TASK_HEARTBEAT_TIMEOUT_SECONDS",
        "a number of seconds > 0 (a running TI silent this long is failed or retried)",
        _positive,
        _setting("TASK_HEARTBEAT_TIMEOUT_SECONDS"),
    ),
    Rule(
        "assets_app.E022",
        "Q_CLUSTER_IDLE_WAIT_SECONDS",
        "a number of seconds > 0 and <= 60 (an idle cluster looks at its queue this often)",
        lambda v: isinstance(v, int | float) and 0 < v <= 60,
        _setting("Q_CLUSTER_IDLE_WAIT_SECONDS"),
    ),
    Rule(
        "assets_app.E023",
        "RUN_WAIT_MAX_SECONDS",
        "a number of seconds > 0 and <= 20 (a run wait holds a web worker, which gunicorn "
        "kills at 30 s)",
        lambda v: isinstance(v, int | float) and 0 < v <= 20,
        _setting("RUN_WAIT_MAX_SECONDS"),
    ),
    Rule(
        "assets_app.E024",
        "RUN_WAIT_MAX_CONCURRENT",
        "a whole number >= 1 and below WEB_WORKERS (run waits streamed at once per server: "
        "each holds a web worker, and one must stay free for the workers' calls)",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v < settings.WEB_WORKERS,
        _setting("RUN_WAIT_MAX_CONCURRENT"),
    ),
    Rule(
        "assets_app.E025",
        "TASK_REPAIR_INTERVAL_SECONDS",
        "a number of seconds > 0 and below ASSET_HEALTH_MAX_AGE_SECONDS (the repair timer's "
        "beat is how /healthz knows the timers process is alive)",
        lambda v: (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and v > 0
            # Only against a valid ASSET_HEALTH_MAX_AGE_SECONDS (E014 names an invalid one).
            and not (
                isinstance(age := settings.ASSET_HEALTH_MAX_AGE_SECONDS, int)
                and age >= 1
                and v >= age
            )
        ),
        _setting("TASK_REPAIR_INTERVAL_SECONDS"),
    ),
    Rule(
        "assets_app.E026",
        "TIMERS_MAX_WAIT_SECONDS",
        "a number of seconds > 0 (a timer's longest sleep, whatever it expects)",
        _positive,
        _setting("TIMERS_MAX_WAIT_SECONDS"),
    ),
    Rule(
        "assets_app.E027",
        "TIMERS_POLL_SECONDS",
        "a number of seconds > 0 (how often a timer looks on SQLite)",
        _positive,
        _setting("TIMERS_POLL_SECONDS"),
    ),
    Rule(
        "assets_app.E028",
        "TIMERS_BACKGROUND_NICE",
        "a whole number from 0 to 19",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 19,
        _setting("TIMERS_BACKGROUND_NICE"),
    ),
    Rule(
        "assets_app.E029",
        "TIMERS_TIME_PROCESSES",
        "a whole number from 1 to 16",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16,
        _setting("TIMERS_TIME_PROCESSES"),
    ),
    Rule(
        "assets_app.E030",
        "DAGS_ARE_PAUSED_AT_CREATION",
        "True or False",
        lambda v: isinstance(v, bool),
        _setting("DAGS_ARE_PAUSED_AT_CREATION"),
    ),
    Rule(
        "assets_app.E031",
        "JWT_EXPIRATION_TIME",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("JWT_EXPIRATION_TIME"),
    ),
    Rule(
        "assets_app.E032",
        "JWT_CLI_EXPIRATION_TIME",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("JWT_CLI_EXPIRATION_TIME"),
    ),
    Rule(
        "assets_app.E033",
        "JWT_AUDIENCE",
        "a non-empty string",
        lambda v: isinstance(v, str) and bool(v),
        _setting("JWT_AUDIENCE"),
    ),
    Rule(
        "assets_app.E034",
        "JWT_LEEWAY_SECONDS",
        "a whole number of seconds >= 0",
        lambda v: isinstance(v, int) and v >= 0,
        _setting("JWT_LEEWAY_SECONDS"),
    ),
    Rule(
        "assets_app.E035",
        "LOGIN_FAILURE_LIMIT",
        "a whole number >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("LOGIN_FAILURE_LIMIT"),
    ),
    Rule(
        "assets_app.E036",
        "LOGIN_FAILURE_WINDOW_SECONDS",
        "a whole number of seconds >= 1",
        lambda v: isinstance(v, int) and v >= 1,
        _setting("LOGIN_FAILURE_WINDOW_SECONDS"),
    ),
)


def check_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Each rule of SETTING_RULES whose setting holds a value it does not allow: an Error."""
    return [
        checks.Error(
            f"{rule.setting} is {rule.value()!r}; it must be {rule.allowed}.",
            hint=f"Set {rule.setting} in the environment or .env (see .env.example).",
            id=rule.id,
        )
        for rule in SETTING_RULES
        if not rule.ok(rule.value())
    ]


def _key_errors() -> Iterator[checks.CheckMessage]:
    configured = [(name, getattr(settings, name, "") or "") for name in EXPOSED_KEYS]
    for i, (first, value) in enumerate(configured):
        for second, other in configured[i + 1 :]:
            if value and value == other:
                yield checks.Error(
                    f"{first} and {second} hold the same value: whoever holds one holds both "
                    "roles (a worker could sync Dag definitions, or forge tokens).",
                    hint=f"Unset {second} (the service generates its own under KEY_DIR) or give "
                    "each key its own random value.",
                    id="assets_app.E107",
                )
    fernet_error = encryption.check_key()
    if fernet_error:
        yield checks.Error(
            fernet_error,
            hint="Unset FERNET_KEY (a key is generated under var/) or set one made by "
            "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key()"
            ".decode())'`.",
            id="assets_app.E109",
        )
    for setting, check_id in (
        ("SECRET_KEY", "assets_app.E101"),
        ("WORKER_API_KEY", "assets_app.E102"),
        ("JWT_SECRET", "assets_app.E110"),
    ):
        if getattr(settings, setting) in keys.PUBLISHED_VALUES:
            yield checks.Error(
                f"{setting} is a value published in this repository's history; anyone can "
                "forge worker or login tokens or claim work with it.",
                hint=f"Unset {setting} (the service then generates its own under KEY_DIR) or "
                "set a random value of your own.",
                id=check_id,
            )
    host = settings.BIND_HOST
    if exposure.is_loopback(host):
        return
    for setting in EXPOSED_KEYS:
        value = getattr(settings, setting, "") or ""
        length = len(value)
        if length >= MIN_KEY_LENGTH and len(set(value)) < MIN_KEY_DISTINCT_CHARACTERS:
            yield checks.Error(
                f"{setting} has {length} characters but only {len(set(value))} different ones "
                f"and HOST is {host!r} (not loopback); a key facing a network must be random "
                f"(at least {MIN_KEY_DISTINCT_CHARACTERS} different characters).",
                hint=f"Unset {setting} (a random key is generated under KEY_DIR) or set one made "
                "by `python -c 'import secrets; print(secrets.token_urlsafe(48))'`.",
                id="assets_app.E108",
            )
        if length < MIN_KEY_LENGTH:
            yield checks.Error(
                f"{setting} has {length} characters and HOST is {host!r} (not loopback); a "
                f"service facing a network needs keys of at least {MIN_KEY_LENGTH} random "
                "characters.",
                hint=f"Unset {setting} (a 64-character key is generated under KEY_DIR) or set "
                "a longer random one (`python -c 'import secrets; "
                "print(secrets.token_urlsafe(48))'`).",
                id="assets_app.E106",
            )
    generated = list(settings.GENERATED_KEYS)
    if generated:
        yield checks.Error(
            f"HOST is {host!r} (not loopback) but {' and '.join(generated)} "
            f"{'was' if len(generated) == 1 else 'were'} not configured (generated under "
            f"{settings.KEY_DIR}); a service facing a network needs keys set on purpose.",
            hint="Set them in the environment (e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(48))'`), the same on every host, or bind HOST=127.0.0.1.",
            id="assets_app.E103",
        )
    if settings.DEBUG:
        yield checks.Error(
            f"HOST is {host!r} (not loopback) and DEBUG is on: tracebacks and settings would be "
            "shown to anyone.",
            hint="Set DEBUG=False, or bind HOST=127.0.0.1.",
            id="assets_app.E104",
        )


def check_keys(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Published keys are refused always; generated keys and DEBUG beyond loopback."""
    return list(_key_errors())


def check_deploy(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """`check --deploy`: a worker key long enough not to be guessed."""
    if len(settings.WORKER_API_KEY) >= MIN_WORKER_API_KEY_LENGTH:
        return []
    return [
        checks.Warning(
            f"WORKER_API_KEY has {len(settings.WORKER_API_KEY)} characters; use at least "
            f"{MIN_WORKER_API_KEY_LENGTH} random ones.",
            hint="Unset it (a 64-character key is generated under KEY_DIR) or set a longer one.",
            id="assets_app.W105",
        )
    ]
