"""``submit`` and ``jobs`` as a user types them: real processes talking to a real cluster's REST
API with a token, so roles apply and the job records who submitted it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.clusterkit import PYTHON, ROOT, Cluster, wait_for

pytestmark = pytest.mark.cluster

BATCH = "env { job.mode = BATCH, job.name = ${name} }\n"
BATCH += "source { FakeSource { row.num = 20 } }\nsink { Blackhole { } }\n"
FAILING = (
    "env { parallelism = 1 }\nsource { FakeSource { row.num = 50 } }\n"
    'transform { RowFilter { field = id, op = ">", value = "not-a-number" } }\n'
    "sink { Console { } }\n"
)
ENDLESS = (
    "env { job.mode = STREAMING, parallelism = 1 }\n"
    "source { FakeSource { rows.per-second = 50, endless = true } }\nsink { Blackhole { } }\n"
)


@pytest.fixture(scope="module")
def cc(db_template):
    with Cluster(db_template, masters=1, workers=1, slots=4) as c:
        yield c


def cli_env(c: Cluster, token: str | None = None) -> dict[str, str]:
    """The user's environment: the API's URL and a token, nothing pointing at the cluster's
    var directory (so the defaults are not what answers)."""
    env = {k: v for k, v in c.env.items() if k not in ("KEEL_VAR_DIR", "KEEL_CALLER_DIR")}
    return dict(env, KEEL_API_URL=f"http://127.0.0.1:{c.port}", KEEL_API_TOKEN=token or c.token)


def manage(c: Cluster, cwd: Path, *args: str, token: str | None = None, **kw):
    """``manage.py ARGS`` run from ``cwd`` (not the repository)."""
    cmd = [PYTHON, str(ROOT / "manage.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=cli_env(c, token), text=True, **kw)


def test_c_with_a_relative_path_waits_and_exits_0_with_submitted_by(cc, tmp_path):
    (tmp_path / "confs").mkdir()
    (tmp_path / "confs" / "batch.conf").write_text(BATCH)
    proc = manage(
        cc, tmp_path, "submit", "-c", "confs/batch.conf", "-i", "name=from-i",
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = int(proc.stdout.split()[0])
    assert f"job {job_id} FINISHED: 20 rows read, 20 written" in proc.stderr
    assert f"job {job_id} finished" in proc.stderr
    status, detail = cc.api(f"/api/v1/jobs/{job_id}")
    assert (status, detail["jobName"], detail["submittedBy"]) == (200, "from-i", "admin")
    shown = manage(cc, tmp_path, "jobs", "status", str(job_id), capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"job {job_id} FINISHED" in shown.stdout and "submitted by: admin" in shown.stdout
    listed = manage(cc, tmp_path, "jobs", "list", capture_output=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert any(ln.split()[:2] == [str(job_id), "FINISHED"] for ln in listed.stdout.splitlines())


def test_run_reads_a_relative_path_from_where_it_was_typed(cc, tmp_path):
    (tmp_path / "here.conf").write_text(BATCH)
    env = dict(cc.env, KEEL_CALLER_DIR="/nowhere")  # ./run sets it from its own cwd
    proc = subprocess.run(
        [str(ROOT / "run"), "submit", "here.conf", "--async", "-i", "name=typed-here"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cc.api(f"/api/v1/jobs/{int(proc.stdout)}")[1]["jobName"] == "typed-here"


def test_a_failing_job_exits_1_with_its_error(cc, tmp_path):
    (tmp_path / "fail.conf").write_text(FAILING)
    proc = manage(cc, tmp_path, "submit", "-c", "fail.conf", capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed: " in proc.stderr and "transform[0].RowFilter" in proc.stderr


def test_async_returns_at_once_and_cancel_from_another_process_exits_2(cc, tmp_path):
    (tmp_path / "endless.conf").write_text(ENDLESS)
    detached = manage(
        cc, tmp_path, "submit", "-c", "endless.conf", "--async", capture_output=True, timeout=60
    )
    assert detached.returncode == 0, detached.stderr
    first = int(detached.stdout)
    assert cc.api(f"/api/v1/jobs/{first}")[1]["jobStatus"] not in {"FINISHED", "CANCELED"}
    assert manage(cc, tmp_path, "jobs", "cancel", str(first), timeout=60).returncode == 0
    out = tmp_path / "waiting.out"
    with out.open("w") as sink:
        waiting = subprocess.Popen(
            [PYTHON, str(ROOT / "manage.py"), "submit", "-c", "endless.conf"],
            cwd=tmp_path, env=cli_env(cc), stdout=sink, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        job_id = wait_for(lambda: out.read_text().strip(), 60, what="the job id").strip()
        wait_for(
            lambda: cc.api(f"/api/v1/jobs/{job_id}")[1]["jobStatus"] == "RUNNING",
            60,
            what="the job to run",
        )
        cancel = manage(cc, tmp_path, "jobs", "cancel", job_id, capture_output=True, timeout=60)
        assert cancel.returncode == 0, cancel.stderr
        _, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 2, stderr
    assert f"job {job_id} was canceled by admin" in stderr
    assert cc.api(f"/api/v1/jobs/{first}")[1]["jobStatus"] in {"CANCELING", "CANCELED"}


def test_a_viewer_token_is_refused_for_submit(cc, tmp_path):
    (tmp_path / "batch.conf").write_text(BATCH)
    viewer = (cc.var_dir / "api-token-viewer").read_text().strip()
    before = len(cc.api("/api/v1/jobs")[1]["results"])
    proc = manage(
        cc, tmp_path, "submit", "-c", "batch.conf", "-i", "name=x",
        token=viewer, capture_output=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "submit refused (403)" in proc.stderr
    assert len(cc.api("/api/v1/jobs")[1]["results"]) == before
