"""schemathesis against the live web process: every operation of /api/v1/schema, with
generated (mostly hostile) requests signed by an operator's token, and no answer is a 5xx."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request

import pytest

from tests.clusterkit import PYTHON, ROOT, free_port, lane_redis_url, wait_for

pytestmark = pytest.mark.cluster

MAKE_OPERATOR = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.authtoken.models import Token
from engine.roles import ensure_groups
ensure_groups()
user, _ = get_user_model().objects.get_or_create(username="fuzzer")
user.groups.set([Group.objects.get(name="operator")])
print(Token.objects.get_or_create(user=user)[0].key)
"""


@pytest.fixture(scope="module")
def web(db_template, tmp_path_factory):
    database = db_template.clone()
    env = dict(
        os.environ,
        DATABASE_URL=f"{db_template.server_url}/{database}",
        REDIS_URL=lane_redis_url("spare"),
        KEEL_PROCESS_NAME="web-fuzz",
    )
    token = (
        subprocess.run(
            [PYTHON, "manage.py", "shell", "-c", MAKE_OPERATOR],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = free_port()
    workdir = tmp_path_factory.mktemp("api-fuzz")
    log = open(workdir / "web.log", "w")
    proc = subprocess.Popen(
        [PYTHON, "manage.py", "web", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(up, 60, interval=0.1, what="the web process")
        yield f"http://127.0.0.1:{port}", token, log.name, workdir
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_no_generated_request_gets_a_5xx(web):
    base, token, log, workdir = web
    run = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "schemathesis"),
            "run",
            f"{base}/api/v1/schema",
            "--header",
            f"Authorization: Token {token}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "30",
            "--request-timeout",
            "20",
            "--generation-deterministic",
            "--no-color",
        ],
        cwd=workdir,  # its own state (.schemathesis/) stays out of the project
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:] + "\n--- web log ---\n" + open(log).read()[-3000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated and int(generated.group(1)) >= 100 and generated.group(1) == generated.group(2)
