"""Task groups' log lines captured in process and shipped into PostgreSQL (engine.member.tasklogs,
engine.member.tasklog_shipping): tagged with their task group, fenced by attempt and member,
bounded per task group and in memory, and kept through a database outage."""

from __future__ import annotations

import logging

import psycopg
import pytest

from engine.jobs.tasklog_reading import LOGS_CHANNEL
from engine.member import tasklog_shipping
from engine.member.tasklog_shipping import TaskLogShipper
from engine.member.tasklogs import MAX_MESSAGE, Line, LineBuffer, TaskLogHandler, attributed
from engine.models import TaskGroup, TaskLogLine
from engine.sourceruntime.coordinator import SharedWorkerPool
from tests.clusterkit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CONSOLE_JOB = """
env { job.mode = BATCH, parallelism = 2 }
source { FakeSource { row.num = 3, schema { fields { id = bigint } } } }
sink { Console { } }
"""


@pytest.fixture
def placed(engine):
    """A job whose task groups are placed on a member (attempt and member set), and another
    member."""
    member = engine.add_member(slots=4)
    job = engine.submit(config=CONSOLE_JOB)
    engine.schedule()
    groups = list(TaskGroup.objects.filter(job=job).order_by("id"))
    assert groups and all(g.member_id == member.id for g in groups)
    return job, member, groups, engine.add_member(slots=4)


@pytest.fixture
def capture():
    """A handler on a logger of the test's own, feeding a buffer; remove it afterwards."""
    logger = logging.getLogger("tests.task_logs")
    logger.setLevel(logging.DEBUG)
    made: list[TaskLogHandler] = []

    def make(capacity: int = 10_000) -> LineBuffer:
        buffer = LineBuffer(capacity)
        handler = TaskLogHandler(buffer)
        logger.addHandler(handler)
        made.append(handler)
        return buffer

    yield logger, make
    for handler in made:
        logger.removeHandler(handler)


def lines_of(job_id: int) -> list[TaskLogLine]:
    return list(TaskLogLine.objects.filter(job_id=job_id).order_by("id"))


def test_lines_land_tagged_with_their_task_group_and_the_job_page_is_told(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    shipper = TaskLogShipper(member.id, make(), keep=100)
    reader = groups[1]
    logger.info("not a task group's line")
    with attributed(reader.id, reader.attempt):
        logger.info("row %s", 1)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed")
    with psycopg.connect(**_dsn(), autocommit=True) as listener:
        listener.execute(f"LISTEN {LOGS_CHANNEL}")
        assert shipper.flush() == 2
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [str(job.id)]
    first, second = lines_of(job.id)
    assert (first.task_group_id, first.attempt, first.level, first.logger, first.message) == (
        reader.id,
        reader.attempt,
        logging.INFO,
        "tests.task_logs",
        "row 1",
    )
    assert second.level == logging.ERROR
    assert second.message.startswith("it failed\nTraceback")
    assert "ValueError: boom" in second.message
    assert TaskLogLine.objects.count() == 2  # the line of no task group stayed out


def test_a_stale_attempt_or_another_members_lines_are_refused(placed, capture):
    job, member, groups, other = placed
    logger, make = capture
    buffer = make()
    group = groups[0]
    with attributed(group.id, group.attempt - 1):
        logger.info("an older attempt's late line")
    with attributed(group.id, group.attempt + 1):
        logger.info("an attempt this member was never given")
    assert TaskLogShipper(member.id, buffer, keep=100).flush() == 0
    with attributed(group.id, group.attempt):
        logger.info("written on a member that does not run it")
    assert TaskLogShipper(other.id, buffer, keep=100).flush() == 0
    assert len(buffer) == 0  # refused lines are done with, not retried
    assert lines_of(job.id) == []


def test_each_task_group_keeps_its_newest_lines(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    shipper = TaskLogShipper(member.id, make(), keep=5)
    first, second = groups[0], groups[1]
    for batch in range(2):
        with attributed(first.id, first.attempt):
            for n in range(6):
                logger.info("line %s", batch * 6 + n)
        with attributed(second.id, second.attempt):
            logger.info("the other's line %s", batch)
        shipper.flush()
    kept = [line.message for line in lines_of(job.id) if line.task_group_id == first.id]
    assert kept == [f"line {n}" for n in range(7, 12)]
    other = [line.message for line in lines_of(job.id) if line.task_group_id == second.id]
    assert other == ["the other's line 0", "the other's line 1"]


def test_a_full_buffer_drops_lines_and_says_how_many(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    buffer = make(capacity=3)
    group = groups[0]
    with attributed(group.id, group.attempt):
        for n in range(5):
            logger.info("line %s", n)
    assert len(buffer) == 3
    TaskLogShipper(member.id, buffer, keep=100).flush()
    lines = lines_of(job.id)
    # The oldest go: the newest say most about what goes wrong.
    assert [line.message for line in lines] == [
        "line 2",
        "line 3",
        "line 4",
        "2 log lines dropped",
    ]
    assert lines[-1].level == logging.WARNING and lines[-1].task_group_id == group.id
    TaskLogShipper(member.id, buffer, keep=100).flush()
    assert len(lines_of(job.id)) == 4  # the count was shipped once


def test_lines_evicted_while_a_batch_is_written_are_not_removed_twice():
    buffer = LineBuffer(capacity=3)
    line = lambda n: Line(1, 1, 0.0, logging.INFO, "t", f"line {n}")  # noqa: E731
    for n in range(3):
        buffer.append(line(n))
    written, dropped, mark = buffer.peek(3)
    buffer.append(line(3))  # evicts line 0 while lines 0-2 are being written
    buffer.consume(written, dropped, mark)
    lines, dropped, _ = buffer.peek(10)
    assert [x.message for x in lines] == ["line 3"]
    assert dropped == {}  # line 0 was written after all: no line was lost


def test_a_database_outage_keeps_the_lines_and_never_raises(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    buffer = make()
    group = groups[0]

    def unreachable() -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=1, dbname="keel", connect_timeout=2)

    shipper = TaskLogShipper(member.id, buffer, keep=100, connect=unreachable)
    with attributed(group.id, group.attempt):
        logger.warning("written while the database is away")
    assert shipper.flush_safely() is False
    assert shipper.flush_safely() is False
    assert len(buffer) == 1
    shipper.connect = tasklog_shipping.connect  # the database is back
    assert shipper.flush_safely() is True
    assert [line.message for line in lines_of(job.id)] == ["written while the database is away"]


def test_work_on_the_coordinator_pool_is_attributed_to_the_asking_task_group(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    buffer = make()
    pool = SharedWorkerPool(1)
    try:
        enumerator = groups[0]
        with attributed(enumerator.id, enumerator.attempt):
            pool.submit(lambda: logger.info("discovered on the pool")).result(10)
        pool.submit(lambda: logger.info("asked by nobody")).result(10)
    finally:
        pool.executor.shutdown()
    TaskLogShipper(member.id, buffer, keep=100).flush()
    assert [(line.task_group_id, line.message) for line in lines_of(job.id)] == [
        (enumerator.id, "discovered on the pool")
    ]


def test_the_shipper_thread_ships_and_its_last_flush_on_stop(placed, capture):
    job, member, groups, _ = placed
    logger, make = capture
    group = groups[0]
    shipper = TaskLogShipper(member.id, make(), keep=100, interval=0.05)
    shipper.start()
    try:
        with attributed(group.id, group.attempt):
            logger.info("x" * (MAX_MESSAGE * 2))
            logger.info("a NUL \x00 inside")
        wait_for(lambda: len(lines_of(job.id)) == 2, 10, what="the lines to be shipped")
        with attributed(group.id, group.attempt):
            logger.info("the last line")
    finally:
        shipper.stop()
    long, nul, last = (line.message for line in lines_of(job.id))
    assert len(long) == MAX_MESSAGE and long.endswith("…")
    assert nul == "a NUL \\x00 inside"
    assert last == "the last line"


def _dsn() -> dict:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
    }


def test_a_task_group_ships_its_last_lines_before_it_reports_its_end(
    engine, placed, capture, monkeypatch
):
    """Its end reported, the master may move the task group at once (a new attempt, which
    refuses the old one's late lines): its last lines, its error's, landed before the report."""
    from django.db.models import F

    from engine.member.dataplane import Counters
    from engine.member.runtime import MemberRuntime, TaskGroupThread
    from engine.states import ExecutionStatus

    job, member, groups, _ = placed
    logger, make = capture
    shipper = TaskLogShipper(member.id, make(), keep=100)  # no thread: only explicit flushes
    monkeypatch.setattr(tasklog_shipping, "_shipper", shipper)
    group = groups[0]
    with attributed(group.id, group.attempt):
        logger.error("its last line: why it failed")
    thread = TaskGroupThread(MemberRuntime(engine.sessions[member.id]), group.id, group.attempt)
    thread.finish(ExecutionStatus.FAILED, "RuntimeError: boom", Counters())
    TaskGroup.objects.filter(id=group.id).update(attempt=F("attempt") + 1)  # the master moves it
    shipper.flush()
    assert [line.message for line in lines_of(job.id)] == ["its last line: why it failed"]
