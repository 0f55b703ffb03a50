"""Commits of completed checkpoints are durable: applied up to N, recorded, and made by a
cancelled job's readers before their sinks are aborted."""

from __future__ import annotations

import textwrap

import psycopg
import pytest

from engine.connectors.batches import from_rows
from engine.connectors.localfile_sink import CheckpointedLocalFileWriter
from engine.connectors.schema import Schema
from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.member import commits as commits_module
from engine.member.commits import ReaderCommits
from engine.member.dataplane import Chain
from engine.models import TaskCheckpoint, TaskGroup
from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import data_db, post, submit, wait_status

__all__ = ["data_db"]  # a fixture shared with the jobs tests


def test_a_localfile_commit_publishes_every_pending_part_up_to_n(tmp_path):
    """Commit 1 was never delivered: committing 2 publishes parts 1 and 2, not 3."""
    config = {"path": str(tmp_path), "file_format_type": "csv", "field_delimiter": ","}
    config["header"] = False
    writer = CheckpointedLocalFileWriter(
        config, Schema((("id", "bigint"),)), {"jobId": 1, "attempt": 1}
    )
    for checkpoint in (1, 2, 3):
        writer.write(from_rows([(checkpoint,)], Schema((("id", "bigint"),))))
        writer.prepare_commit(checkpoint)
    writer.commit({"checkpoint": 2})
    writer.abort()
    published = sorted(p.read_text() for p in tmp_path.glob("part-*.csv"))
    assert published == ["1\n", "2\n"]


@pytest.mark.django_db(transaction=True)
def test_a_reader_commits_a_completed_checkpoint_whose_command_never_came(
    engine, tmp_path, monkeypatch
):
    """The COMPLETED row and the reader's ack are the record: the reader commits from them on
    its own (its poll, POLL_INTERVAL after its ack), once, and records it; no commit command
    is needed."""
    now = [1000.0]
    monkeypatch.setattr(commits_module, "monotonic", lambda: now[0])
    engine.add_member(slots=4)
    job = submit_job(
        "env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 1000 }\n"
        "source { FakeSource { } }\nsink { Blackhole { } }"
    )
    engine.schedule()
    engine.run_deployed()
    groups = {g.kind: g for g in TaskGroup.objects.filter(job=job)}
    enumerator, reader = groups["ENUMERATOR"], groups["READER"]
    checkpoint_id = checkpoints.trigger_due(engine.epoch)[0][0]
    config = {"path": str(tmp_path), "file_format_type": "csv", "field_delimiter": ","}
    config["header"] = False
    writer = CheckpointedLocalFileWriter(
        config, Schema((("id", "bigint"),)), {"jobId": job.id, "attempt": reader.attempt}
    )
    writer.write(from_rows([(7,)], Schema((("id", "bigint"),))))
    sink_state = writer.prepare_commit(checkpoint_id)
    assert checkpoints.acknowledge(checkpoint_id, enumerator.id, enumerator.attempt, {})
    commits = ReaderCommits(
        reader.id, reader.attempt, reader.member_id, checkpointing=True, restored=None
    )
    assert commits.acknowledge(checkpoint_id, {"splits": {}, "sinks": [sink_state]})
    assert checkpoints.complete_or_expire(engine.epoch) == 1  # its commit command: lost
    chain = Chain(steps={}, sinks=[("sink[0].LocalFile", "s0", writer)])
    now[0] += commits_module.POLL_INTERVAL - 0.01
    commits.apply(chain)  # the command may still come: not asked yet
    assert commits.committed == 0
    now[0] += 0.02
    commits.apply(chain)
    writer.abort()
    assert [p.read_text() for p in tmp_path.glob("part-*.csv")] == ["7\n"]
    assert commits.committed == checkpoint_id
    ack = TaskCheckpoint.objects.get(checkpoint_id=checkpoint_id, task_group=reader)
    assert ack.committed_at is not None


@pytest.fixture(scope="module")
def sc(db_template):
    with Cluster(db_template, masters=1, workers=1, slots=4) as c:
        yield c


@pytest.mark.cluster
def test_a_cancelled_job_commits_the_checkpoint_that_completed(sc, data_db):
    """Streaming FakeSource -> Jdbc, checkpoints every 300 ms, cancelled: the target holds
    exactly the rows of the newest completed checkpoint, whose commit every reader recorded."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE dst (id bigint, name text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(
        sc,
        textwrap.dedent(f"""
        env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 300 }}
        source {{ FakeSource {{ split.num = 2, rows.per-second = 2000, endless = true,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = dst }} }}
    """),
    )
    wait_for(lambda: sc.checkpoints_completed(job_id) >= 3, 30, interval=0.05, what="checkpoints")
    assert post(sc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(sc, job_id, {"CANCELED", "FAILED", "FINISHED"})["jobStatus"] == "CANCELED"
    cut, readers, committed = sc.newest_completed_cut(job_id)
    assert readers == committed == 2
    with psycopg.connect(data_db) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM dst").fetchone()
    assert (rows, distinct) == (cut, cut)


def test_a_reader_asks_for_completed_checkpoints_only_after_acking_one():
    """A checkpoint completes for a reader only once it has acked it: between its commit and
    its next ack, its poll asks the database nothing (every reader polls between batches)."""
    asked = []

    def db(what, call, *args):
        asked.append(what)
        return True if call is checkpoints.acknowledge else None  # acked; none completed yet

    commits = ReaderCommits(1, 1, 1, checkpointing=True, restored=5, db=db)
    chain = Chain(steps={}, sinks=[])
    for _ in range(3):
        commits.apply(chain, now=True)
    assert asked == []
    assert commits.acknowledge(6, {})
    commits.apply(chain, now=True)
    assert asked == ["acknowledging a barrier", "finding completed checkpoints"]
