"""Finding 8 (and 1) of issue 13: every setting with a rule has a system check, registered in
the app config, with an id and a message naming the setting and what is allowed; `check
--deploy` is clean for the production settings `.env.example` documents."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from assets_app.guards import checks as rules

ROOT = Path(__file__).resolve().parent.parent

# (setting override, the check id, words the message must name)
BAD_SETTINGS = [
    ({"ASSET_REGISTRATION_MODE": "queu"}, "assets_app.E001", ["'queu'", "'queue'", "'inline'"]),
    ({"ASSET_QUEUE_BATCH_SIZE": 0}, "assets_app.E002", [">= 1"]),
    ({"ASSET_QUEUE_BATCH_OUTLETS": -5}, "assets_app.E003", [">= 1"]),
    ({"ASSET_QUEUE_MAX_ATTEMPTS": 0}, "assets_app.E004", [">= 1"]),
    ({"ASSET_QUEUE_BACKOFF_BASE_SECONDS": 0.0}, "assets_app.E005", ["> 0"]),
    ({"ASSET_QUEUE_BACKOFF_CAP_SECONDS": 1.0}, "assets_app.E006", ["BASE"]),
    ({"ASSET_DRAIN_TIME_BUDGET_SECONDS": 60.0}, "assets_app.E007", ["Q_CLUSTER_TIMEOUT"]),
    ({"Q_CLUSTER": {"timeout": 90, "retry": 90}}, "assets_app.E008", ["Q_CLUSTER_RETRY"]),
    ({"Q_CLUSTER": {"workers": 0}}, "assets_app.E009", [">= 1"]),
    ({"Q_CLUSTER": {"poll": 0}}, "assets_app.E010", ["> 0"]),
    ({"ASSET_DRAIN_YIELD_ABOVE_PER_SECOND": -1.0}, "assets_app.E011", [">= 0"]),
    ({"ASSET_DRAIN_YIELD_MAX_SECONDS": -1.0}, "assets_app.E012", [">= 0"]),
    ({"ASSET_DRAIN_NICE": 25}, "assets_app.E013", ["0 to 19"]),
    ({"ASSET_HEALTH_MAX_AGE_SECONDS": 0}, "assets_app.E014", [">= 1"]),
    ({"ASSET_HEALTH_STARTUP_GRACE_SECONDS": -1}, "assets_app.E015", [">= 0"]),
    ({"WORKER_TOKEN_LIFETIME_SECONDS": 0}, "assets_app.E016", [">= 1"]),
    ({"WORKLOAD_CLAIM_TIMEOUT_SECONDS": 0}, "assets_app.E017", [">= 1"]),
    ({"DATABASE_POOL_MAX_SIZE": 0}, "assets_app.E018", ["MIN_SIZE"]),
    ({"DATABASE_POOL_TIMEOUT_SECONDS": 0.0}, "assets_app.E019", ["> 0"]),
    ({"DATABASE_RETRY_AFTER_SECONDS": 0}, "assets_app.E020", [">= 1"]),
    ({"TASK_HEARTBEAT_TIMEOUT_SECONDS": 0.0}, "assets_app.E021", ["> 0"]),
    ({"Q_CLUSTER_IDLE_WAIT_SECONDS": 0.0}, "assets_app.E022", ["> 0"]),
    ({"Q_CLUSTER_IDLE_WAIT_SECONDS": 120}, "assets_app.E022", ["<= 60"]),
    ({"RUN_WAIT_MAX_SECONDS": 30}, "assets_app.E023", ["<= 20"]),
    ({"RUN_WAIT_MAX_CONCURRENT": 0}, "assets_app.E024", [">= 1"]),
    ({"TASK_REPAIR_INTERVAL_SECONDS": 0}, "assets_app.E025", ["> 0"]),
    ({"TASK_REPAIR_INTERVAL_SECONDS": 600}, "assets_app.E025", ["ASSET_HEALTH_MAX_AGE_SECONDS"]),
    ({"TIMERS_MAX_WAIT_SECONDS": 0}, "assets_app.E026", ["> 0"]),
    ({"TIMERS_POLL_SECONDS": -1.0}, "assets_app.E027", ["> 0"]),
    ({"TIMERS_BACKGROUND_NICE": 20}, "assets_app.E028", ["0 to 19"]),
    ({"TIMERS_TIME_PROCESSES": 0}, "assets_app.E029", ["1 to 16"]),
    ({"DAGS_ARE_PAUSED_AT_CREATION": "yes"}, "assets_app.E030", ["True or False"]),
    ({"JWT_EXPIRATION_TIME": 0}, "assets_app.E031", [">= 1"]),
    ({"JWT_CLI_EXPIRATION_TIME": -60}, "assets_app.E032", [">= 1"]),
    ({"JWT_AUDIENCE": ""}, "assets_app.E033", ["non-empty"]),
    ({"JWT_LEEWAY_SECONDS": -1}, "assets_app.E034", [">= 0"]),
    ({"LOGIN_FAILURE_LIMIT": 0}, "assets_app.E035", [">= 1"]),
    ({"LOGIN_FAILURE_WINDOW_SECONDS": 0}, "assets_app.E036", [">= 1"]),
]


def _apply(settings, override: dict) -> str:
    """Apply one bad value; returns the setting name the message must start with."""
    ((name, value),) = override.items()
    if name == "Q_CLUSTER":
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, **value}
        key = next(iter(value)) if len(value) == 1 else "timeout"
        return f"Q_CLUSTER_{key.upper()}"
    setattr(settings, name, value)
    return name


def test_the_default_settings_pass_every_check():
    assert rules.check_settings() == []
    assert rules.check_keys() == []


def test_pool_larger_min_than_max_is_an_error(settings):
    settings.DATABASE_POOL_MIN_SIZE = 5
    settings.DATABASE_POOL_MAX_SIZE = 4
    assert [e.id for e in rules.check_settings()] == ["assets_app.E018"]


def test_every_rule_is_tested():
    assert sorted(r.id for r in rules.SETTING_RULES) == sorted({b[1] for b in BAD_SETTINGS})


@pytest.mark.parametrize(("override", "check_id", "words"), BAD_SETTINGS, ids=lambda x: str(x))
def test_a_setting_out_of_its_rule_is_an_error_naming_it(settings, override, check_id, words):
    setting = _apply(settings, override)
    (error,) = rules.check_settings()
    assert error.id == check_id
    assert error.level == checks.ERROR
    assert error.msg.startswith(setting), error.msg
    assert "must be" in error.msg
    for word in words:
        assert word in error.msg, error.msg


def test_a_registration_mode_typo_stops_manage_py_check(settings):
    """Registered in the app config: `manage.py check` (and so migrate, and so bin/serve) stops
    on it instead of silently running queue mode."""
    settings.ASSET_REGISTRATION_MODE = "Inline"
    with pytest.raises(SystemCheckError, match=r"assets_app\.E001"):
        call_command("check")


def test_the_cluster_command_still_runs_the_service_checks_but_not_the_url_checks():
    """`manage.py qcluster` is assets_app's (it comes before django_q in INSTALLED_APPS): a bad
    setting stops the cluster before it forks, while the URL checks, which would import the web
    tier into every cluster process, are not run."""
    from django.core.management import get_commands, load_command_class

    command = load_command_class(get_commands()["qcluster"], "qcluster")
    assert type(command).__module__ == "assets_app.management.commands.qcluster"
    assert "assets_app" in command.requires_system_checks
    assert checks.Tags.security in command.requires_system_checks
    assert checks.Tags.urls not in command.requires_system_checks
    result = _manage(
        "qcluster", "--run-once", env={**os.environ, "ASSET_QUEUE_BATCH_OUTLETS": "-5"}
    )
    assert result.returncode != 0
    assert "assets_app.E003" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("setting", ["SECRET_KEY", "WORKER_API_KEY", "JWT_SECRET"])
def test_a_published_key_is_an_error(settings, setting):
    setattr(settings, setting, "dev-worker-api-key")
    (error,) = rules.check_keys()
    assert (
        error.id
        == {
            "SECRET_KEY": "assets_app.E101",
            "WORKER_API_KEY": "assets_app.E102",
            "JWT_SECRET": "assets_app.E110",
        }[setting]
    )
    assert error.msg.startswith(setting)


def test_exposed_with_generated_keys_or_debug_is_an_error(settings):
    settings.BIND_HOST = "0.0.0.0"
    settings.GENERATED_KEYS = ["WORKER_API_KEY"]
    settings.DEBUG = True
    errors = rules.check_keys()
    assert [e.id for e in errors] == ["assets_app.E103", "assets_app.E104"]
    assert "WORKER_API_KEY was not configured" in errors[0].msg
    assert "'0.0.0.0'" in errors[0].msg
    settings.GENERATED_KEYS = []
    settings.DEBUG = False
    assert rules.check_keys() == []
    settings.BIND_HOST = "127.0.0.1"
    settings.GENERATED_KEYS = ["SECRET_KEY", "WORKER_API_KEY"]
    settings.DEBUG = True
    assert rules.check_keys() == []  # loopback: generated keys are fine


@pytest.mark.parametrize("setting", ["SECRET_KEY", "WORKER_API_KEY", "DAG_SYNC_KEY", "JWT_SECRET"])
def test_exposed_with_a_short_key_is_an_error(settings, setting):
    """Issue 26: HOST=0.0.0.0 with SECRET_KEY=x and WORKER_API_KEY=y started and served."""
    for name in rules.EXPOSED_KEYS:
        setattr(settings, name, name.lower() + "-" + "r" * 40)
    settings.GENERATED_KEYS = []
    settings.BIND_HOST = "0.0.0.0"
    assert rules.check_keys() == []
    setattr(settings, setting, "x" * (rules.MIN_KEY_LENGTH - 1))
    (error,) = rules.check_keys()
    assert error.id == "assets_app.E106" and error.msg.startswith(setting)
    assert f"at least {rules.MIN_KEY_LENGTH}" in error.msg
    settings.BIND_HOST = "127.0.0.1"
    assert rules.check_keys() == []  # loopback: a short key is the operator's business


def test_deploy_warns_about_a_short_worker_key(settings):
    settings.WORKER_API_KEY = "short"
    (warning,) = rules.check_deploy()
    assert (warning.id, warning.level) == ("assets_app.W105", checks.WARNING)
    settings.WORKER_API_KEY = "k" * 32
    assert rules.check_deploy() == []


def _production_settings() -> dict[str, str]:
    """The `# NAME=value` lines of .env.example's production section."""
    text = (ROOT / ".env.example").read_text()
    section = text.split("# --- Production", 1)[1].split("# ---", 1)[0]
    lines = dict(re.findall(r"^# ([A-Z_]+)=(.*)$", section, re.M))
    assert {"SECURE_SSL_REDIRECT", "SECRET_KEY", "WORKER_API_KEY", "HOST"} <= set(lines)
    # Placeholders (<...>) are the operator's own values: the test brings its own.
    return {name: value for name, value in lines.items() if not value.startswith("<")}


def _manage(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECRET_KEY", "WORKER_", "DAG_SYNC_KEY", "JWT_SECRET"))
    }
    clean.update(DJANGO_SETTINGS_MODULE="project.settings", **env)
    return _manage("check", "--deploy", "--fail-level", "WARNING", env=clean)


def test_check_deploy_is_clean_for_the_documented_production_settings(tmp_path):
    production = _production_settings()
    production.update(
        SECRET_KEY="a-random-secret-key-" + "x7Q2" * 10,
        WORKER_API_KEY="a-random-worker-key-" + "p9Z3" * 5,
        DAG_SYNC_KEY="a-random-deploy-key-" + "k4W8" * 5,
        JWT_SECRET="a-random-login-key-" + "m5T1" * 5,
        KEY_DIR=str(tmp_path / "keys"),
    )
    result = _check_deploy(production)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert not (tmp_path / "keys").exists()  # nothing generated

    # The same exposed service without configured keys refuses.
    del production["SECRET_KEY"], production["WORKER_API_KEY"]
    result = _check_deploy(production)
    assert result.returncode != 0
    assert "assets_app.E103" in result.stderr


# --- issue 38: keys that pass the length rule but not a reader's -----------------------------


def _good_keys(settings):
    for name in rules.EXPOSED_KEYS:
        setattr(settings, name, name.lower() + "-" + "r" * 40)
    settings.GENERATED_KEYS = []


def test_two_roles_sharing_one_key_is_an_error_wherever_it_binds(settings):
    _good_keys(settings)
    settings.DAG_SYNC_KEY = settings.WORKER_API_KEY
    for host in ("127.0.0.1", "0.0.0.0"):
        settings.BIND_HOST = host
        errors = [e for e in rules.check_keys() if e.id == "assets_app.E107"]
        assert len(errors) == 1, host
        assert "DAG_SYNC_KEY" in errors[0].msg and "WORKER_API_KEY" in errors[0].msg


def test_exposed_with_a_key_of_few_distinct_characters_is_an_error(settings):
    _good_keys(settings)
    settings.BIND_HOST = "0.0.0.0"
    settings.WORKER_API_KEY = "a" * 64
    (error,) = rules.check_keys()
    assert error.id == "assets_app.E108" and error.msg.startswith("WORKER_API_KEY")
    settings.BIND_HOST = "127.0.0.1"
    assert rules.check_keys() == []


def test_a_malformed_fernet_key_is_an_error(settings):
    _good_keys(settings)
    settings.FERNET_KEY = "not-a-fernet-key"
    (error,) = rules.check_keys()
    assert error.id == "assets_app.E109" and "FERNET_KEY" in error.msg
    settings.FERNET_KEY = ""
    assert rules.check_keys() == []


def test_run_wait_slots_must_leave_a_web_worker_free(settings):
    settings.WEB_WORKERS = 2
    settings.RUN_WAIT_MAX_CONCURRENT = 2
    (error,) = [e for e in rules.check_settings() if e.id == "assets_app.E024"]
    assert "below WEB_WORKERS" in error.msg
    settings.RUN_WAIT_MAX_CONCURRENT = 1
    assert "assets_app.E024" not in [e.id for e in rules.check_settings()]
