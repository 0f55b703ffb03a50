"""With PostgreSQL or Redis unreachable every command prints one clear line
naming the URL and how to start the service, exits non-zero, and shows no traceback."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.clusterkit import PYTHON, ROOT, RUN, free_port, pid_alive

pytestmark = pytest.mark.cluster

DEAD_PG = f"postgres://keel:secret@127.0.0.1:{free_port()}/keel"
DEAD_REDIS = f"redis://127.0.0.1:{free_port()}/0"

COMMANDS = [
    [PYTHON, "manage.py", "master", "--name", "m-x"],
    [PYTHON, "manage.py", "worker", "--name", "w-x", "--slots", "1"],
    [PYTHON, "manage.py", "web", "--port", "1"],
    [PYTHON, "manage.py", "cluster", "up", "--port", "1"],
    [RUN, "cluster", "up", "--port", "1"],
    [RUN, "cluster", "start", "worker-1"],
    [RUN, "bench", "failover"],
    [RUN, "manage", "migrate"],
]


def run(argv, **env):
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def assert_one_clear_line(proc, service, url_fragment):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("error: ") and service in line and url_fragment in line
    assert "start it" in line or "set " in line
    assert "secret" not in line  # the password is masked


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[-4:]))
def test_postgres_unreachable(argv, tmp_path):
    proc = run(argv, DATABASE_URL=DEAD_PG, KEEL_VAR_DIR=str(tmp_path))
    assert_one_clear_line(proc, "PostgreSQL", DEAD_PG.replace("secret", "***"))


@pytest.mark.parametrize("argv", COMMANDS[:5], ids=lambda a: " ".join(a[-4:]))
def test_redis_unreachable(argv, tmp_path, db_template):
    url = f"postgres://127.0.0.1:5432/{db_template.clone()}"
    proc = run(argv, DATABASE_URL=url, REDIS_URL=DEAD_REDIS, KEEL_VAR_DIR=str(tmp_path))
    assert_one_clear_line(proc, "Redis", DEAD_REDIS)
    # `cluster up` starts its processes before it can check the services: none outlives it.
    assert not [p for p in left_running(tmp_path)], left_running(tmp_path)


def left_running(var_dir) -> list[int]:
    """Pids of a cluster's processes under ``var_dir`` that are still alive."""
    pids = []
    for path in (var_dir / "cluster").glob("*.pid"):
        pid = int(path.read_text().split()[0])
        if pid_alive(pid):
            pids.append(pid)
    return pids
