"""Helpers of the engine-level dirty-job tracking tests (tests/test_dirty_*.py without a cluster).

They drive ``tests.enginekit.Engine`` into the situations the tests start from and read back the
attempts and events the tracker recorded; ``Fault`` makes the tracking store fail for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from engine.models import EngineEvent, Pipeline, RecoveryAttempt, TaskGroup
from tests.enginekit import Engine


def running_job(e: Engine, members: int = 3, **submit) -> tuple[object, list]:
    """A running two-pipeline job on two members (each hosts a task group of both pipelines),
    then ``members - 2`` more members with free slots to restore onto."""
    hosts = [e.add_member() for _ in range(2)]
    job = e.submit(**submit)
    e.schedule()
    e.run_deployed()
    assert e.running(job)
    hosts += [e.add_member() for _ in range(members - 2)]
    return job, hosts


def host_of_both_pipelines(e: Engine, job) -> object:
    """A member that runs a task group of every pipeline of the job."""
    for member in e.alive():
        pipelines = set(
            TaskGroup.objects.filter(job=job, member=member, status="RUNNING").values_list(
                "pipeline_id", flat=True
            )
        )
        if len(pipelines) == Pipeline.objects.filter(job=job).count():
            return member
    raise AssertionError("no member hosts every pipeline")


def attempts(job) -> list[tuple[str, str]]:
    return list(
        RecoveryAttempt.objects.filter(job=job).order_by("id").values_list("attempt_id", "state")
    )


def kinds(job, kind: str) -> int:
    return EngineEvent.objects.filter(job_id=job.id, kind=kind).count()


class Fault:
    """Real failures of the tracking store: a trigger that rejects writes (inserts and updates)
    of a table for chosen jobs."""

    def __init__(self) -> None:
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS test_dirty_fault (job_id bigint, tbl text)")
            cur.execute(
                """
                CREATE OR REPLACE FUNCTION test_dirty_fault() RETURNS trigger AS $$
                BEGIN
                  IF EXISTS (SELECT 1 FROM test_dirty_fault
                              WHERE job_id = NEW.job_id AND tbl = TG_TABLE_NAME) THEN
                    RAISE EXCEPTION 'injected tracking-store failure for job %', NEW.job_id;
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql
                """
            )
            for table in ("engine_dirtyjobstate", "engine_recoveryattempt"):
                cur.execute(
                    "CREATE OR REPLACE TRIGGER test_dirty_fault BEFORE INSERT OR UPDATE"
                    f" ON {table} FOR EACH ROW EXECUTE FUNCTION test_dirty_fault()"
                )

    def on(self, job, table: str = "engine_dirtyjobstate") -> None:
        with connection.cursor() as cur:
            cur.execute("INSERT INTO test_dirty_fault VALUES (%s, %s)", [job.id, table])

    def off(self) -> None:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM test_dirty_fault")

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove the table, the triggers and the function again."""
        with connection.cursor() as cur:
            cur.execute("DROP TABLE test_dirty_fault CASCADE")
            cur.execute("DROP TRIGGER test_dirty_fault ON engine_dirtyjobstate")
            cur.execute("DROP TRIGGER test_dirty_fault ON engine_recoveryattempt")
            cur.execute("DROP FUNCTION test_dirty_fault")


@contextmanager
def history_fault() -> Iterator[None]:
    """A real failure of the finished-job record: a trigger that rejects every insert."""
    with connection.cursor() as cur:
        cur.execute(
            """
            CREATE FUNCTION test_history_fault() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'injected history failure'; END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_history_fault BEFORE INSERT ON history_jobhistory
               FOR EACH ROW EXECUTE FUNCTION test_history_fault();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER test_history_fault ON history_jobhistory")
            cur.execute("DROP FUNCTION test_history_fault")
