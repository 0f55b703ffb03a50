"""Project hygiene that users and operators rely on: migrations, deploy checks, lint."""

from __future__ import annotations

import os
import subprocess

from tests.clusterkit import PYTHON, ROOT


def manage(*args, **env):
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=120,
    )


def test_models_and_migrations_agree():
    proc = manage("makemigrations", "--check", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_production_settings_pass_check_deploy():
    proc = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        KEEL_PRODUCTION="1",
        DJANGO_SECRET_KEY="x" * 20 + "-test-only-" + "y" * 40,
        DJANGO_ALLOWED_HOSTS="keel.example.com",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_production_refuses_to_start_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    proc = subprocess.run(
        [PYTHON, "manage.py", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(env, KEEL_PRODUCTION="1"),
        timeout=120,
    )
    assert proc.returncode != 0
    assert "DJANGO_SECRET_KEY" in proc.stderr and "Traceback" not in proc.stderr


def test_ruff_is_clean():
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ruff"), "check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
