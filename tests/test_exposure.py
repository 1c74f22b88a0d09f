"""Finding 1 of issue 13: bin/serve no longer creates admin/admin; beyond loopback it refuses a
password (or key) that was not set on purpose."""

import os
import subprocess
from pathlib import Path

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from assets_app.guards import exposure

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db


def bootstrap(capsys, **options) -> str:
    call_command("bootstrap_admin", **options)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("assets.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert exposure.is_loopback(host) is loopback


def test_first_admin_gets_a_random_password_printed_once(capsys, monkeypatch):
    monkeypatch.delenv("ADMIN_PASSWORD", raising=False)
    out = bootstrap(capsys)
    assert out.startswith("admin login: user 'admin', password '")
    password = out.split("password '", 1)[1].split("'", 1)[0]
    assert password != "admin" and len(password) >= 16
    assert authenticate(username="admin", password=password) is not None
    assert authenticate(username="admin", password="admin") is None
    again = bootstrap(capsys)
    assert again == (
        "admin login: use your existing superuser ('admin'); to reset its password: "
        ".venv/bin/python manage.py changepassword admin\n"
    )
    assert password not in again


def test_admin_password_from_the_environment_is_honoured(capsys, monkeypatch):
    monkeypatch.setenv("ADMIN_PASSWORD", "s3cret-pass")
    assert "password 's3cret-pass'" in bootstrap(capsys)
    assert authenticate(username="admin", password="s3cret-pass") is not None


@pytest.mark.parametrize(
    ("password", "message"),
    [
        (None, "set ADMIN_PASSWORD"),
        ("admin", "published password"),
        ("short", "too short"),
    ],
)
def test_exposed_the_first_admin_needs_a_valid_password_set_on_purpose(
    settings, monkeypatch, password, message
):
    settings.BIND_HOST = "0.0.0.0"
    monkeypatch.delenv("ADMIN_PASSWORD", raising=False)
    with pytest.raises(CommandError, match=message):
        call_command("bootstrap_admin", password=password)
    assert not get_user_model().objects.exists()


def test_exposed_with_a_good_password_creates_the_admin(settings, capsys):
    settings.BIND_HOST = "0.0.0.0"
    assert "password 'correct-horse-battery'" in bootstrap(capsys, password="correct-horse-battery")


def test_exposed_an_existing_superuser_with_the_published_password_is_refused(settings):
    get_user_model().objects.create_superuser(username="admin", email="", password="admin")
    call_command("bootstrap_admin")  # loopback: allowed (the operator's own machine)
    settings.BIND_HOST = "0.0.0.0"
    with pytest.raises(CommandError, match="changepassword"):
        call_command("bootstrap_admin")


def test_bin_serve_beyond_loopback_refuses_generated_keys(tmp_path):
    """HOST=0.0.0.0 without SECRET_KEY / WORKER_API_KEY: bin/serve stops before it serves."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SECRET_KEY", "WORKER_API_KEY", "ADMIN_PASSWORD")
    }
    env.update(
        HOST="0.0.0.0",
        PORT="1",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        KEY_DIR=str(tmp_path / "keys"),
    )
    result = subprocess.run(
        [str(ROOT / "bin/serve")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "assets_app.E103" in output
    assert "serving on" not in output
