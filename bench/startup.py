"""How fast the engine's processes start, timed as an operator sees it (the CLI included).

- ``./run cluster up`` with 2 masters and 3 workers, until every process is alive in the API
  (the masters as candidates with one active, the workers as ALIVE members); goal <= 6 s;
- ``./run cluster start worker-1`` after ``./run cluster stop worker-1``, until the new member
  is ALIVE in the API; goal <= 1.5 s.

Each is printed beside a reference measured in the same run: one fresh interpreter that sets
Django up with every app and exits (``manage.py check --help``), the floor of any command.
The test kit's path (devcluster.control and its fork server) is measured as well, for the
test suite's sake. Only ``./run``, the API and a migrated template are used, so this file
measures an older checkout too.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import redis

from tests.clusterkit import PYTHON, ROOT, RUN, DatabaseTemplate, free_port, wait_for

ROUNDS = 3
BENCH_REDIS = "redis://127.0.0.1:6379/15"


def _env(template: DatabaseTemplate, var_dir: Path) -> dict[str, str]:
    redis.Redis.from_url(BENCH_REDIS).flushdb()  # no message of an earlier round
    return dict(
        os.environ,
        DATABASE_URL=f"{template.server_url}/{template.clone()}",
        REDIS_URL=BENCH_REDIS,
        KEEL_VAR_DIR=str(var_dir),
    )


def _run(env: dict[str, str], *args: str) -> None:
    subprocess.run([RUN, *args], cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)


def _api(port: int, var_dir: Path, path: str):
    token = (var_dir / "api-token").read_text().strip()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", f"Token {token}")
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def _members(port: int, var_dir: Path) -> list[dict]:
    body = _api(port, var_dir, "/api/v1/members?state=ALIVE")
    return body["results"] if isinstance(body, dict) else body


def _all_alive(port: int, var_dir: Path) -> bool:
    overview = _api(port, var_dir, "/api/v1/overview")
    names = {m["name"] for m in _members(port, var_dir)}
    return bool(overview.get("activeMaster")) and {"worker-1", "worker-2", "worker-3"} <= names


def cli_round(template: DatabaseTemplate) -> tuple[float, float]:
    """One cluster through ``./run``: (up to all alive, restart of worker-1 to ALIVE)."""
    var_dir = Path(tempfile.mkdtemp(prefix="keel-bench-startup-"))
    env, port = _env(template, var_dir), free_port()
    up = ("cluster", "up", "--masters", "2", "--workers", "3", "--slots", "2")
    try:
        started = time.monotonic()
        _run(env, *up, "--heartbeat-timeout", "3", "--port", str(port))
        wait_for(lambda: _all_alive(port, var_dir), 30, 0.05, "every process in the API")
        up_time = time.monotonic() - started
        _run(env, "cluster", "stop", "worker-1")
        started = time.monotonic()
        _run(env, "cluster", "start", "worker-1")
        wait_for(
            lambda: "worker-1" in {m["name"] for m in _members(port, var_dir)},
            30,
            0.02,
            "worker-1 ALIVE",
        )
        return up_time, time.monotonic() - started
    finally:
        subprocess.run([RUN, "cluster", "down"], cwd=ROOT, env=env, capture_output=True)
        shutil.rmtree(var_dir, ignore_errors=True)


def measure_cli(template: DatabaseTemplate) -> tuple[list[float], list[float]]:
    rounds = [cli_round(template) for _ in range(ROUNDS)]
    return [r[0] for r in rounds], [r[1] for r in rounds]


def measure_kit(template: DatabaseTemplate) -> tuple[list[float], list[float]] | None:
    """The same through the test kit's control process, where this checkout has one."""
    try:
        from tests.clusterkit import Cluster, Control  # noqa: F401 (present since the kit has it)
    except ImportError:
        return None
    ups, restarts = [], []
    for _ in range(ROUNDS):
        cluster = Cluster(template, masters=2, workers=3, slots=2)
        try:
            started = time.monotonic()
            cluster.up()
            wait_for(lambda c=cluster: _all_alive(c.port, c.var_dir), 30, 0.05, "every process")
            ups.append(time.monotonic() - started)
            cluster.run("cluster", "stop", "worker-1")
            started = time.monotonic()
            cluster.start("worker-1")
            wait_for(
                lambda c=cluster: "worker-1" in {m["name"] for m in _members(c.port, c.var_dir)},
                30,
                0.02,
                "worker-1 ALIVE",
            )
            restarts.append(time.monotonic() - started)
        finally:
            cluster.down()
    return ups, restarts


def reference() -> float:
    """One fresh interpreter that sets Django up with every app and exits (median of 3)."""
    samples = []
    for _ in range(3):
        started = time.monotonic()
        subprocess.run(
            [PYTHON, "manage.py", "check", "--help"], cwd=ROOT, check=True, capture_output=True
        )
        samples.append(time.monotonic() - started)
    return statistics.median(samples)


def report(what: str, samples: list[float], ref: float, goal: float | None) -> None:
    median = statistics.median(samples)
    target = f" (goal <= {goal:.1f} s)" if goal else ""
    print(
        f"{what}: median {median:.2f} s, max {max(samples):.2f} s over {len(samples)} rounds,"
        f" {median / ref:.1f}x the reference{target}"
    )


def main() -> None:
    template = DatabaseTemplate()
    try:
        ref = reference()
        print(f"reference (a fresh interpreter setting Django up): {ref:.2f} s")
        ups, restarts = measure_cli(template)
        report("./run cluster up, 2 masters + 3 workers, to all alive in the API", ups, ref, 6.0)
        report("./run cluster start worker-1 after a stop, to ALIVE", restarts, ref, 1.5)
        kit = measure_kit(template)
        if kit:
            report("test kit (control process, fork server): up", kit[0], ref, None)
            report("test kit (control process, fork server): restart", kit[1], ref, None)
    finally:
        template.drop_all()


if __name__ == "__main__":
    main()
