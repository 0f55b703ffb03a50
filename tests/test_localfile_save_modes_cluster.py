"""The LocalFile sink's save modes on a real cluster: the first enumerator applies them in its
worker before any reader has a split (engine.member.savemodes), and a failed check fails the
job naming the option."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.clusterkit import run_batch_job, wait_for

pytestmark = pytest.mark.cluster


def job(path: Path, mode: str) -> str:
    return f"""
    env {{ job.mode = BATCH, parallelism = 2, job.retry.times = 0 }}
    source {{ FakeSource {{ row.num = 3, schema {{ fields {{ id = bigint }} }} }} }}
    sink {{ LocalFile {{ path = "{path}", file_format_type = json, data_save_mode = {mode} }} }}
    """


def stale_directory() -> Path:
    path = Path(tempfile.mkdtemp()) / "out"
    (path / "k=1").mkdir(parents=True)
    (path / "k=1" / "old.json").write_text("{}\n")
    return path


def test_drop_data_runs_once_before_the_readers(healthy):
    target = stale_directory()
    job_id = run_batch_job(healthy, job(target, "DROP_DATA"), "a DROP_DATA job")
    assert not (target / "k=1").exists()
    rows = [json.loads(ln) for p in target.glob("*.jsonl") for ln in p.open()]
    assert len(rows) == 2 * 3  # row.num rows per reader, both readers' rows kept
    assert healthy.one(
        "SELECT save_modes_applied_at IS NOT NULL FROM engine_job WHERE id = %s", (job_id,)
    )


def test_error_when_data_exists_fails_the_job_naming_the_option(healthy):
    target = stale_directory()
    code, body = healthy.post("/api/v1/jobs", {"config": job(target, "ERROR_WHEN_DATA_EXISTS")})
    assert code == 201, body
    wait_for(
        lambda: healthy.one(
            "SELECT status = 'FAILED' FROM engine_job WHERE id = %s", (body["jobId"],)
        ),
        120,
        interval=0.2,
        what="the job to fail",
    )
    error = healthy.one("SELECT error_msg FROM engine_job WHERE id = %s", (body["jobId"],))
    assert "data_save_mode: ERROR_WHEN_DATA_EXISTS" in error
    assert (target / "k=1" / "old.json").exists()
