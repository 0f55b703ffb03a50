"""``./run demo``: the main job starts a cluster, prints how to reach it, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.clusterkit import (
    ROOT,
    RUN,
    SERVER_URL,
    free_port,
    lane_redis_url,
    pid_alive,
    wait_for,
)

pytestmark = pytest.mark.cluster


def start_demo(args: list[str], env: dict) -> subprocess.Popen:
    """``./run demo`` in its own process group (so a test can send it Ctrl-C)."""
    return subprocess.Popen(
        [RUN, "demo", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until_ready(demo: subprocess.Popen) -> str:
    """Everything the demo printed up to its "Press Ctrl-C" line."""
    output = []
    for line in demo.stdout:
        output.append(line)
        if "Press Ctrl-C" in line:
            break
    return "".join(output)


def test_demo_runs_until_ctrl_c_and_stops_everything(db_template):
    port = free_port()
    var_dir = tempfile.mkdtemp(prefix="keel-demo-")
    redis_url = lane_redis_url("spare")
    redis.Redis.from_url(redis_url).flushdb()
    env = dict(
        os.environ,
        DATABASE_URL=f"{SERVER_URL}/{db_template.clone()}",
        REDIS_URL=redis_url,
        KEEL_VAR_DIR=var_dir,
        PYTHONUNBUFFERED="1",
    )
    demo = start_demo(["--port", str(port), "--chaos", "--chaos-interval", "6"], env)
    try:
        text = read_until_ready(demo)
        assert f"http://127.0.0.1:{port}/" in text, text
        token = re.search(r"API token:\s+(\w+)", text).group(1)
        assert re.search(r"Login:\s+admin / \S+", text)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/overview", headers={"Authorization": f"Token {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            overview = json.loads(resp.read())
        assert overview["members"]["alive"] == 3 and overview["activeMaster"]
        # The representative example jobs went in and run: the batch ones finish.
        jobs = re.search(r"Jobs:\s+(.*)", text).group(1).split(", ")
        assert len(jobs) == 5 and any(j.endswith("tracked-stream") for j in jobs), text
        assert "Chaos:      a random worker is killed every 6 s" in text

        def finished_jobs():
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/jobs?jobStatus=FINISHED",
                headers={"Authorization": f"Token {token}"},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                return {j["jobName"] for j in json.loads(resp.read())["results"]}

        wait_for(
            lambda: {"fake-to-csv", "orders-to-report"} <= finished_jobs(),
            60,
            interval=0.5,
            what="the demo's batch jobs to finish",
        )
        # --chaos: a worker is killed and started again, and the tracked job counts it.
        tracked = int(next(j for j in jobs if j.endswith("tracked-stream")).split()[0])

        def attempts():
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/jobs/{tracked}",
                headers={"Authorization": f"Token {token}"},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())["dirtyTask"]["recoveryAttemptCount"]

        wait_for(lambda: attempts() >= 1, 60, interval=0.5, what="a chaos kill to count")
        pids = [int(p.read_text().split()[0]) for p in (ROOT / var_dir / "cluster").glob("*.pid")]
        assert len(pids) == 6
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        rest = demo.communicate(timeout=60)[0]
    assert demo.returncode == 0, rest
    assert "demo stopped" in rest
    wait_for(lambda: not any(pid_alive(p) for p in pids), 30, what="every demo process to stop")


def test_demo_starts_private_services_when_nothing_answers():
    """The embedded default: with nothing at the default URLs, ``./run demo`` starts private
    PostgreSQL and Redis under .var/, runs the cluster on them, and stops them on Ctrl-C."""
    # initdb runs as the postgres user when we are root: it must be able to reach the folder.
    var_dir = Path(tempfile.mkdtemp(prefix="keel-embedded-"))
    os.chmod(var_dir, 0o755)
    pg_port, redis_port, port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        KEEL_VAR_DIR=str(var_dir),
        PYTHONUNBUFFERED="1",
        KEEL_DEFAULT_DATABASE_URL=f"postgres://127.0.0.1:{free_port()}/keel",
        KEEL_DEFAULT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        KEEL_EMBEDDED_PG_PORT=str(pg_port),
        KEEL_EMBEDDED_REDIS_PORT=str(redis_port),
    )
    demo = start_demo(["--port", str(port), "--workers", "1"], env)
    try:
        text = read_until_ready(demo)
        assert "started a private one under .var/postgres" in text, text
        assert "started a private one under .var/redis" in text, text
        assert (var_dir / "postgres" / "PG_VERSION").exists()
        token = re.search(r"API token:\s+(\w+)", text).group(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/overview", headers={"Authorization": f"Token {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read())["members"]["alive"] == 1
        assert redis.Redis(port=redis_port).ping()
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        rest = demo.communicate(timeout=90)[0]
    assert demo.returncode == 0, rest

    def stopped() -> bool:
        try:
            redis.Redis(port=redis_port, socket_connect_timeout=0.5).ping()
            return False
        except redis.ConnectionError:
            return not (var_dir / "postgres" / "postmaster.pid").exists()

    wait_for(stopped, 30, interval=0.2, what="the private services to stop")
