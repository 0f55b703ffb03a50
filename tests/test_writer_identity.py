"""A Jdbc sink's writer is its job's, not its job id's: job ids restart in every engine
database, so two clusters (or one whose database was made anew) writing to one target must not
end each other's sessions, commit or drop each other's staged rows. A writer's fence ends only
sessions of its own database."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from engine.connectors.batches import from_rows
from engine.connectors.jdbc_sessions import fence_older_attempts, sink_application_name, writer_key
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter
from engine.connectors.schema import Schema
from tests.clusterkit import SERVER_URL, admin_conn, wait_for
from tests.faultkit import session_alive
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]

MEMBER = "0b0e9ac4-5b0c-4a5e-9a55-7f1f9d0d4c01"
SCHEMA = Schema((("id", "bigint"), ("name", "string")))


def context(job_uuid: str | None, attempt: int, **more) -> dict:
    return {
        "jobId": 1,
        "jobUuid": job_uuid,
        "pipelineId": 1,
        "readerIndex": 0,
        "attempt": attempt,
        "memberUuid": MEMBER,
        "checkpointing": True,
        **more,
    }


@pytest.fixture
def target(data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE dst (id bigint, name text)")
    return data_db


def test_two_clusters_job_1_into_one_table_keep_their_own_rows(target):
    """Cluster A's job 1 stages rows; cluster B's job 1 opens its second attempt on the same
    table (restoring nothing): A's session lives on and A's rows are still A's to commit."""
    url = "jdbc:" + target.replace("postgres://", "postgresql://")
    config = {"url": url, "user": "root", "password": "t", "table": "dst"}
    ours = ExactlyOnceJdbcWriter(config, SCHEMA, context(str(uuid.uuid4()), attempt=1))
    theirs = None
    try:
        ours.write(from_rows([(1, "a"), (2, "b")], SCHEMA))
        ours.prepare_commit(1)
        theirs = ExactlyOnceJdbcWriter(config, SCHEMA, context(str(uuid.uuid4()), attempt=2))
        theirs.write(from_rows([(3, "c")], SCHEMA))
        assert session_alive(ours.conn)
        ours.commit({"checkpoint": 1})
        with psycopg.connect(target) as conn:
            assert conn.execute("SELECT id FROM dst ORDER BY id").fetchall() == [(1,), (2,)]
    finally:
        ours.abort()
        if theirs is not None:
            theirs.abort()


def test_a_job_from_before_uuids_keeps_the_key_its_staged_rows_carry():
    assert writer_key(context(None, 1)) == "1-1-0"
    one, other = (writer_key(context(str(uuid.uuid4()), 1)) for _ in range(2))
    assert one != other and "1-1-0" not in (one, other)


def test_a_fence_ends_older_attempts_in_its_own_database_only(data_db):
    """The same writer key in another database (another cluster's target) is not this
    writer's: its session lives."""
    other_db = f"{data_db.rsplit('/', 1)[1]}_other"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{other_db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{other_db}"')
    writer = "1-1-0"
    older = sink_application_name(MEMBER, writer, 1)
    here_old = psycopg.connect(data_db, application_name=older, autocommit=True)
    elsewhere = psycopg.connect(f"{SERVER_URL}/{other_db}", application_name=older, autocommit=True)
    fencer = psycopg.connect(data_db, application_name=sink_application_name(MEMBER, writer, 2))
    try:
        fence_older_attempts(fencer, writer, 2)
        wait_for(
            lambda: not session_alive(here_old), 10, what="this database's older attempt to end"
        )
        assert session_alive(elsewhere)
    finally:
        for conn in (here_old, elsewhere, fencer):
            conn.close()
        with admin_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{other_db}" WITH (FORCE)')


SUBMIT = "env { job.mode = BATCH }\nsource { FakeSource { } }\nsink { Blackhole { } }"


@pytest.mark.django_db(transaction=True)
def test_a_job_gets_a_uuid_only_while_every_member_names_writers_so():
    """A member of an older protocol names a job's writers after its id: while one is alive,
    a new job gets no uuid (its writers keep its id's names on every member), and such a
    member may not join while a job with a uuid runs."""
    from engine.cluster.membership import MemberRefused, register_member
    from engine.jobs.submission import submit_job
    from engine.protocol import WRITER_UUID_SINCE

    current = register_member("w-new", 4, "FIXED")
    try:
        first, second = submit_job(SUBMIT), submit_job(SUBMIT)
        assert first.uuid and second.uuid and first.uuid != second.uuid
        with pytest.raises(MemberRefused, match="upgrade this worker"):
            register_member("w-old", 4, "FIXED", protocol_version=WRITER_UUID_SINCE - 1)
        from engine.models import Job

        Job.objects.filter(id__in=[first.id, second.id]).update(status="CANCELED")
        older = register_member("w-old", 4, "FIXED", protocol_version=WRITER_UUID_SINCE - 1)
        try:
            assert submit_job(SUBMIT).uuid is None
        finally:
            older.close()
    finally:
        current.close()
