"""``./run demo``: the main job starts a cluster, prints how to reach it, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.request

import redis

from tests.clusterkit import ROOT, RUN, SERVER_URL, free_port, pid_alive, wait_for


def test_demo_runs_until_ctrl_c_and_stops_everything(db_template):
    port = free_port()
    var_dir = tempfile.mkdtemp(prefix="keel-demo-")
    redis_url = "redis://127.0.0.1:6379/7"
    redis.Redis.from_url(redis_url).flushdb()
    env = dict(
        os.environ,
        DATABASE_URL=f"{SERVER_URL}/{db_template.clone()}",
        REDIS_URL=redis_url,
        KEEL_VAR_DIR=var_dir,
        PYTHONUNBUFFERED="1",
    )
    demo = subprocess.Popen(
        [RUN, "demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = []
    try:
        for line in demo.stdout:
            output.append(line)
            if "Press Ctrl-C" in line:
                break
        text = "".join(output)
        assert f"http://127.0.0.1:{port}/" in text, text
        token = re.search(r"API token:\s+(\w+)", text).group(1)
        assert re.search(r"Login:\s+admin / \S+", text)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/overview", headers={"Authorization": f"Token {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            overview = json.loads(resp.read())
        assert overview["members"]["alive"] == 3 and overview["activeMaster"]
        pids = [int(p.read_text()) for p in (ROOT / var_dir / "cluster").glob("*.pid")]
        assert len(pids) == 6
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        rest = demo.communicate(timeout=60)[0]
    assert demo.returncode == 0, rest
    assert "demo stopped" in rest
    wait_for(lambda: not any(pid_alive(p) for p in pids), 30, what="every demo process to stop")
