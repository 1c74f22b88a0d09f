"""Issue 26, point 6 (part): API token creation is audited (the key never is)."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from assets_app.models import AuditEntry


@pytest.mark.django_db
def test_create_api_token_command_is_audited_without_the_key():
    get_user_model().objects.create_user("ops", password="pw")
    out = StringIO()
    call_command("create_api_token", "ops", "--name", "deploy", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    entry = AuditEntry.objects.get(action="api_token.create")
    assert entry.via == "command" and entry.actor_name.startswith("os:")
    assert "ops" in entry.summary and "deploy" in entry.summary
    assert key not in entry.summary and key not in str(entry.detail)
    assert list(entry.targets.values_list("kind", flat=True)) == ["api_token"]
