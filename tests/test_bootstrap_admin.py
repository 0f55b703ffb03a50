"""``manage.py bootstrap_admin`` (docker compose's ``admin`` service): a fresh installation's
admin login and API token, printed; run again it keeps both and never shows the password it
did not set; ``--reset-password`` and ``--reset-token`` replace them."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from engine.roles import ADMIN, SUBMIT_JOB

pytestmark = pytest.mark.django_db


def admin():
    return get_user_model().objects.get(username="admin")


def bootstrap(*args: str) -> tuple[str | None, str]:
    out = io.StringIO()
    call_command("bootstrap_admin", *args, stdout=out)
    text = out.getvalue()
    password = re.search(r"password:  (\S+)   \(set now", text)
    token = re.search(r"API token: (\S+)", text)
    assert token, text
    return (password.group(1) if password else None), token.group(1)


def test_the_first_run_sets_and_prints_a_login_and_later_runs_keep_it(client):
    password, token = bootstrap()
    assert password
    user = admin()
    assert user.check_password(password) and user.is_staff and user.has_perm(SUBMIT_JOB)
    assert user.groups.filter(name=ADMIN).exists()
    response = client.get("/api/v1/overview", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200

    assert bootstrap() == (None, token)  # nothing changed, and no password shown

    new_password, same_token = bootstrap("--reset-password")
    assert new_password and new_password != password and same_token == token
    assert not admin().check_password(password)
    assert admin().check_password(new_password)

    _, new_token = bootstrap("--reset-token")
    assert new_token != token
    refused = client.get("/api/v1/overview", HTTP_AUTHORIZATION=f"Token {token}")
    assert refused.status_code == 401
