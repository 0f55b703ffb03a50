"""The Jdbc sink's two-phase writer (``is_exactly_once = true``): rows go straight into the
target in a transaction prepared at each barrier and committed when its checkpoint completes;
a new attempt settles what older ones prepared against the checkpoint it restores from; an
ended job's cleanup settles what it left; without prepared transactions it is the stage."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from engine.connectors.batches import from_rows
from engine.connectors.jdbc import JdbcSink
from engine.connectors.jdbc_prepared import PreparedJdbcWriter, settle_job
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter
from engine.connectors.schema import Schema
from tests.faultkit import PrivatePostgres
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]

SCHEMA = Schema.from_json([["id", "bigint"], ["name", "string"]])


@pytest.fixture(scope="module")
def server():
    with PrivatePostgres({"max_prepared_transactions": 8}) as pg:
        yield pg


@pytest.fixture
def target(server):
    """A fresh keyless table on the server that allows prepared transactions."""
    dsn = f"{server.url}/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
        conn.execute("DROP TABLE IF EXISTS target")
        conn.execute("CREATE TABLE target (id bigint, name text)")
    return dsn


def config_for(dsn: str, **extra) -> dict:
    url = "jdbc:" + dsn.replace("postgres://", "postgresql://").replace("postgres@", "")
    return {
        "url": url,
        "user": "postgres",
        "password": "t",
        "table": "target",
        "query": "",
        "is_exactly_once": True,
        **extra,
    }


def writer_for(dsn: str, attempt: int, restored: int | None = None, job: str = "prepared-test"):
    context = {
        "jobUuid": job,
        "pipelineId": 1,
        "readerIndex": 0,
        "attempt": attempt,
        "checkpointing": True,
        "restoredCheckpoint": restored,
    }
    return JdbcSink(config_for(dsn), "sink[0].Jdbc").writer(SCHEMA, context)


def batch(*ids: int):
    return from_rows([(i, f"name-{i}") for i in ids], SCHEMA)


def ids(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM target"
        ).fetchone()[0]


def prepared_gids(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [g for (g,) in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def test_rows_are_written_once_into_the_target_and_appear_when_their_checkpoint_completes(target):
    writer = writer_for(target, attempt=1)
    assert isinstance(writer, PreparedJdbcWriter)
    try:
        writer.write(batch(1, 2, 3))
        first = writer.prepare_commit(1)
        writer.write(batch(4, 5))
        second = writer.prepare_commit(2)
        assert writer.prepare_commit(3)["transaction"] is None  # nothing written, nothing prepared
        assert ids(target) == []  # prepared: durable, invisible
        assert prepared_gids(target) == sorted([first["transaction"], second["transaction"]])
        writer.commit(first)
        writer.commit(first)  # twice: nothing more
        assert ids(target) == [1, 2, 3]
        writer.commit(second)
        assert ids(target) == [1, 2, 3, 4, 5]
        assert prepared_gids(target) == []
    finally:
        writer.abort()
    with psycopg.connect(target) as conn:  # no stage: the rows went straight in
        assert conn.execute("SELECT to_regclass('target__keel_stage')").fetchone() == (None,)


def test_a_restore_commits_what_completed_and_rolls_back_the_rest(target):
    first = writer_for(target, attempt=1)
    first.write(batch(1, 2))
    first.prepare_commit(1)  # completes, but its commit never ran: the worker died
    first.write(batch(3))
    first.prepare_commit(2)  # never completed
    first.write(batch(4))  # never prepared
    first.abort()  # as a kill -9 leaves it: two prepared, one open and lost
    assert ids(target) == []
    second = writer_for(target, attempt=2, restored=1)
    try:
        assert ids(target) == [1, 2]
        assert prepared_gids(target) == []
        second.write(batch(3, 4))  # replayed from checkpoint 1's offsets
        second.prepare_commit(5)
        second.commit({"checkpoint": 5})
        assert ids(target) == [1, 2, 3, 4]
    finally:
        second.abort()


def test_a_restore_from_nothing_rolls_back_everything_an_older_attempt_prepared(target):
    first = writer_for(target, attempt=1)
    first.write(batch(1))
    first.prepare_commit(1)
    first.abort()
    writer_for(target, attempt=2, restored=None).abort()
    assert (ids(target), prepared_gids(target)) == ([], [])


def test_a_newer_attempt_fences_the_older_one_mid_transaction(target):
    zombie = writer_for(target, attempt=1)
    zombie.write(batch(1))  # its transaction is open when the newer attempt starts
    newer = writer_for(target, attempt=2, restored=None)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the session was ended: any driver error
            zombie.write(batch(2))
            zombie.prepare_commit(1)
        newer.write(batch(3))
        newer.prepare_commit(1)
        newer.commit({"checkpoint": 1})
        assert ids(target) == [3]
    finally:
        newer.abort()
        zombie.conn.close()


def test_a_batch_pipeline_closing_commits_what_it_prepared_and_what_is_open(target):
    writer = writer_for(target, attempt=1)
    writer.write(batch(1))
    writer.prepare_commit(1)
    writer.write(batch(2))
    writer.close()
    assert (ids(target), prepared_gids(target)) == ([1, 2], [])


def test_an_ended_jobs_cleanup_commits_up_to_its_newest_completed_checkpoint(target):
    job = str(uuid.uuid4())
    for pipeline, checkpoints in ((1, (4, 6)), (2, (5,))):
        writer = JdbcSink(config_for(target), "sink[0].Jdbc").writer(
            SCHEMA,
            {
                "jobUuid": job,
                "pipelineId": pipeline,
                "readerIndex": 0,
                "attempt": 1,
                "checkpointing": True,
            },
        )
        for checkpoint in checkpoints:
            writer.write(batch(pipeline * 100 + checkpoint))
            writer.prepare_commit(checkpoint)
        writer.abort()  # cancelled: its last commits never ran
    # Another job's prepared transaction is not this cleanup's.
    other = writer_for(target, attempt=1, job=str(uuid.uuid4()))
    other.write(batch(999))
    other.prepare_commit(1)
    other.abort()
    # Pipeline 1 completed checkpoint 4 (6 did not); pipeline 2 completed none.
    assert settle_job(config_for(target), job, {1: 4}) == (1, 2)
    assert ids(target) == [104]
    assert len(prepared_gids(target)) == 1
    assert settle_job(config_for(target), job, {1: 4}) == (0, 0)  # again: nothing left


@pytest.mark.parametrize("why", ["no prepared transactions", "an upsert"])
def test_without_prepared_transactions_or_for_an_upsert_the_stage_writes(why, target, data_db):
    if why == "an upsert":
        config = config_for(target, primary_keys=["id"])
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("ALTER TABLE target ADD PRIMARY KEY (id)")
    else:  # the shared server runs with max_prepared_transactions = 0
        with psycopg.connect(data_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE target (id bigint, name text)")
        config = config_for(data_db, user="root")
    context = {"jobUuid": "stage", "pipelineId": 1, "readerIndex": 0, "attempt": 1}
    writer = JdbcSink(config, "sink[0].Jdbc").writer(SCHEMA, {**context, "checkpointing": True})
    try:
        assert isinstance(writer, ExactlyOnceJdbcWriter)
        writer.write(batch(1))
        writer.prepare_commit(1)
        writer.commit({"checkpoint": 1})
    finally:
        writer.abort()
    assert ids(target if why == "an upsert" else data_db) == [1]


@pytest.mark.django_db(transaction=True)
def test_the_terminal_cleanup_settles_what_a_cancelled_job_left_prepared(engine, target):
    from engine.jobs import cleanup
    from engine.models import Checkpoint
    from tests.test_cleanup_records import ended_job, make_due

    url = config_for(target)["url"]
    job = ended_job(
        engine,
        f"""
        env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 60000 }}
        source {{ FakeSource {{ schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ Jdbc {{ url = "{url}", user = postgres, password = t, table = target,
                       is_exactly_once = true }} }}""",
    )
    completed = Checkpoint.objects.get(job=job, state="COMPLETED")
    # A reader prepared the completed checkpoint and a later one; neither commit ran before
    # the job was cancelled.
    writer = writer_for(target, attempt=1, job=str(job.uuid))
    writer.write(batch(1))
    writer.prepare_commit(completed.id)
    writer.write(batch(2))
    writer.prepare_commit(completed.id + 1)
    writer.abort()
    assert cleanup.execute(make_due(job).id) == "done"
    assert (ids(target), prepared_gids(target)) == ([1], [])


def stage_writer(dsn: str, attempt: int, restored: int | None = None) -> ExactlyOnceJdbcWriter:
    context = {
        "jobUuid": "prepared-test",
        "pipelineId": 1,
        "readerIndex": 0,
        "attempt": attempt,
        "restoredCheckpoint": restored,
    }
    return ExactlyOnceJdbcWriter(config_for(dsn), SCHEMA, context)


def test_an_attempt_after_one_that_staged_rows_commits_them_through_the_stage(target):
    """The writer may change between attempts (prepared transactions allowed since): rows an
    older attempt staged for a completed checkpoint are committed, not stranded."""
    first = stage_writer(target, attempt=1)
    first.write(batch(1, 2))
    first.prepare_commit(1)  # completes; its commit never ran
    first.write(batch(3))
    first.abort()
    second = writer_for(target, attempt=2, restored=1)
    try:
        assert isinstance(second, ExactlyOnceJdbcWriter)
        assert ids(target) == [1, 2]
    finally:
        second.abort()
    with psycopg.connect(target) as conn:  # the stage holds nothing of this writer now
        assert conn.execute("SELECT count(*) FROM target__keel_stage").fetchone() == (0,)
    writer_for(target, attempt=3, restored=1).abort()  # and the next attempt prepares again
    assert isinstance(writer_for(target, attempt=4, restored=1), PreparedJdbcWriter)


def test_an_attempt_through_the_stage_settles_what_an_older_one_prepared(target):
    first = writer_for(target, attempt=1)
    first.write(batch(1))
    first.prepare_commit(1)  # completes; its commit never ran
    first.write(batch(2))
    first.prepare_commit(2)  # never completes
    first.abort()
    second = stage_writer(target, attempt=2, restored=1)
    second.abort()
    assert (ids(target), prepared_gids(target)) == ([1], [])


def test_a_commit_takes_only_its_own_attempts_transactions(target):
    """What an older attempt prepared is settled when the newer one opens; one prepared after
    that (a zombie the fence missed) is never committed by the newer attempt's commits."""
    newer = writer_for(target, attempt=2, restored=None)
    try:
        # The zombie's data session prepares checkpoint 3 after the newer attempt opened.
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO target VALUES (9, 'zombie')")
            conn.execute("PREPARE TRANSACTION 'keel:prepared-test-1-0:3:1'")
        newer.write(batch(1))
        newer.prepare_commit(4)
        newer.commit({"checkpoint": 4})
        assert ids(target) == [1]
        assert prepared_gids(target) == ["keel:prepared-test-1-0:3:1"]
    finally:
        newer.abort()
