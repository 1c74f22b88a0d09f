"""Finding 1 of issue 13: no published key. Without SECRET_KEY / WORKER_API_KEY configured the
service generates its own under KEY_DIR (0600, the same across restarts and processes); a token
forged with the old published secret and the old published worker key are refused."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest
from django.test import Client

from assets_app.guards import keys
from assets_app.models import TIState
from tests.factories import TaskInstanceFactory

ROOT = Path(__file__).resolve().parent.parent
OLD_SECRET_KEY = "dev-only-insecure-secret-key-change-me-in-production"
OLD_WORKER_API_KEY = "dev-worker-api-key"
PRINT_KEYS = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps([s.SECRET_KEY, s.WORKER_API_KEY, s.GENERATED_KEYS]))"
)


def _settings_keys(key_dir: Path, **env: str) -> tuple[str, str, list[str]]:
    """SECRET_KEY, WORKER_API_KEY and GENERATED_KEYS as a fresh process with no key configured
    (nothing in the environment; no .env in a checkout) sees them."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SECRET_KEY", "WORKER_API_KEY", "DAG_SYNC_KEY", "JWT_SECRET")
    }
    clean.update(DJANGO_SETTINGS_MODULE="project.settings", KEY_DIR=str(key_dir), **env)
    result = subprocess.run(
        [sys.executable, "-c", PRINT_KEYS],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    secret, worker, generated = json.loads(result.stdout.strip().splitlines()[-1])
    return secret, worker, generated


def test_without_configured_keys_the_service_generates_its_own_and_keeps_them(tmp_path):
    key_dir = tmp_path / "keys"
    first = _settings_keys(key_dir)
    secret, worker, generated = first
    assert generated == ["SECRET_KEY", "WORKER_API_KEY", "JWT_SECRET"]
    assert secret not in keys.PUBLISHED_VALUES and worker not in keys.PUBLISHED_VALUES
    assert secret != worker and len(secret) >= 50 and len(worker) >= 50
    for name, value in (("secret_key", secret), ("worker_api_key", worker)):
        path = key_dir / name
        assert path.read_text().strip() == value
        assert path.stat().st_mode & 0o777 == 0o600
    assert key_dir.stat().st_mode & 0o777 == 0o700
    assert _settings_keys(key_dir) == first  # a restart reads the same keys
    other = _settings_keys(tmp_path / "other-install")
    assert other[0] != secret and other[1] != worker  # random per installation


def test_configured_keys_win_and_are_not_generated(tmp_path):
    secret, worker, generated = _settings_keys(
        tmp_path,
        SECRET_KEY="s" * 60,
        WORKER_API_KEY="w" * 40,
        DAG_SYNC_KEY="d" * 40,
        JWT_SECRET="j" * 40,
    )
    assert (secret, worker, generated) == ("s" * 60, "w" * 40, [])
    assert not list(tmp_path.iterdir())


def test_processes_starting_together_agree_on_one_key(tmp_path):
    code = (
        "import sys; from pathlib import Path; from assets_app.guards.keys import generated_key; "
        "print(generated_key('k', directory=Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    values = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(values) == 1 and values != {""}
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no temporary file left


def test_a_key_file_readable_by_others_or_empty_is_refused(tmp_path):
    keys.generated_key("k", directory=tmp_path)
    (tmp_path / "k").chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        keys.generated_key("k", directory=tmp_path)
    (tmp_path / "e").write_text("")
    (tmp_path / "e").chmod(0o600)
    with pytest.raises(ValueError, match="empty"):
        keys.generated_key("e", directory=tmp_path)


def test_generated_key_takes_another_maker_for_other_kinds_of_key(tmp_path):
    """Issue 11 keeps a Fernet key the same way: its own maker, its own file."""
    value = keys.generated_key("fernet_key", directory=tmp_path, make=lambda: "x" * 44)
    assert value == "x" * 44
    assert keys.generated_key("fernet_key", directory=tmp_path) == value


@pytest.mark.django_db
def test_a_token_forged_with_the_published_secret_key_is_refused():
    """The published SECRET_KEY started a TI (200) before; now it signs nothing we accept."""
    ti = TaskInstanceFactory(state=TIState.QUEUED)
    now = int(time.time())
    forged = jwt.encode(
        {"sub": str(ti.id), "scope": "execution", "iat": now, "exp": now + 600},
        OLD_SECRET_KEY,
        algorithm="HS256",
    )
    body = {
        "state": "running",
        "hostname": "attacker",
        "unixname": "x",
        "pid": 1,
        "start_date": "2026-06-30T10:00:00+00:00",
    }
    response = Client().patch(
        f"/execution/task-instances/{ti.id}/run",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {forged}"},
    )
    assert response.status_code == 403
    assert response.json()["detail"]["reason"] == "invalid_token"
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED


@pytest.mark.django_db
def test_the_published_worker_api_key_claims_nothing():
    ti = TaskInstanceFactory(state=TIState.QUEUED)
    response = Client().post(
        "/execution/workloads/claim",
        data={"hostname": "attacker", "limit": 5},
        content_type="application/json",
        headers={"Authorization": f"Bearer {OLD_WORKER_API_KEY}"},
    )
    assert response.status_code == 403
    ti.refresh_from_db()
    assert ti.state == TIState.QUEUED
