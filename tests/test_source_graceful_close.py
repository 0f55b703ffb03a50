"""A member drain closes Lane A readers gracefully before it moves them, in process on real
PostgreSQL through the master's own drain step (the live cluster:
tests/test_source_graceful_close_cluster.py): the readers are sent the close (paced, until
their report answers it) while a Lane B job on the same member moves at once; the Lane A job's
task groups move together once every reader reported its close, the move naming the
checkpoint; a reader that does not close within the bound, or before the drain expires, is
moved anyway; a drain that expires after a reader closed moves that reader (it would never read
again); an enumerator on the member waits for every reader of its pipeline, wherever it runs,
to close. A reader task admits the close once an attempt, in its mailbox's reserved capacity,
and one whose poll ended its input before the close finishes as at the end of its input."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from engine.jobs import drain, graceful_close, lifecycle
from engine.jobs.submission import submit_job
from engine.member.commits import ReaderCommits
from engine.member.managed_reader import ManagedReaderTask
from engine.models import EngineEvent, Job, MemberDrain, TaskGroup
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.limits import MailboxLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from tests.conftest import role_user
from tests.test_source_reader_loop import drain as run_loop
from tests.test_source_reader_loop import loop, send

pytestmark = pytest.mark.django_db(transaction=True)
JOB = (
    "env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 1000 }\n"
    "source { FakeSource { } }\nsink { Blackhole { } }"
)


def submit(engine, settings, lane_a: bool) -> Job:
    connectors = ["FakeSource"] if lane_a else []
    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": connectors}
    job = submit_job(JOB)
    engine.schedule()
    engine.run_deployed()
    return job


def report(group: TaskGroup, checkpoint: int | None) -> None:
    """The reader's own fenced report of its close (ManagedReaderTask._close_report)."""
    close = {"gracefulClose": {"attempt": group.attempt, "checkpoint": checkpoint}}
    assert lifecycle.report_metrics(group.id, group.attempt, group.member_id, 0, 0, 0.0, close)


def live(job: Job, member_id: int) -> list[TaskGroup]:
    return list(TaskGroup.objects.filter(job=job, member_id=member_id, status="RUNNING"))


def test_a_drain_moves_lane_a_readers_once_they_closed_and_lane_b_at_once(engine, settings):
    member = engine.add_member(slots=12)
    lane_a, lane_b = submit(engine, settings, True), submit(engine, settings, False)
    assert lane_a.pipelines.get().plan["sourceRuntime"]["lane"] == "A"
    engine.add_member(slots=12)  # room to move to
    record, _ = drain.request_drain(member.uuid, role_user("olga", "operator"), "upgrade")
    readers = sorted(
        (g for g in live(lane_a, member.id) if g.kind == "READER"), key=lambda g: g.index
    )
    assert len(readers) == 2 and len(live(lane_a, member.id)) == 3

    sent: list = []
    drain.step(engine.epoch, sent.append)
    assert sorted(t.task_group_id for t in sent) == [g.id for g in readers]
    assert live(lane_b, member.id) == [] and len(live(lane_a, member.id)) == 3
    drain.step(engine.epoch, sent.append)
    assert len(sent) == 2  # paced: not sent again within a second

    report(readers[0], 7)  # closed at checkpoint 7
    report(readers[1], None)  # answered, its final checkpoint not committed yet
    graceful_close.resends.sent.clear()  # a second later
    drain.step(engine.epoch, sent.append)
    assert len(sent) == 2 and len(live(lane_a, member.id)) == 3  # both answered: none sent

    report(readers[1], 8)
    drain.step(engine.epoch, sent.append)
    assert live(lane_a, member.id) == []  # every task group of the job there, together
    errors = {
        e.payload["taskGroupId"]: e.payload.get("error", "")
        for e in EngineEvent.objects.filter(kind="taskgroup.status", job_id=lane_a.id)
        if e.payload["to"] == "FAILED"
    }
    assert "closed gracefully at checkpoint 7" in errors[readers[0].id]
    assert "closed gracefully at checkpoint 8" in errors[readers[1].id]
    record.refresh_from_db()
    assert record.moved_task_groups == 3 + 3


def test_a_reader_that_does_not_close_within_the_bound_is_moved_anyway(engine, settings):
    member = engine.add_member(slots=12)
    job = submit(engine, settings, True)
    engine.add_member(slots=12)
    drain.request_drain(member.uuid, role_user("olga", "operator"), "upgrade")
    drain.step(engine.epoch)
    assert len(live(job, member.id)) == 3
    bound = graceful_close.timeout_for(job)
    assert bound == settings.ENGINE["drain.graceful-close-timeout"] >= 3 * 1.0
    MemberDrain.objects.update(created_at=MemberDrain.objects.get().created_at - timedelta(hours=1))
    TaskGroup.objects.update(deployed_at=MemberDrain.objects.get().created_at)
    drain.step(engine.epoch)
    assert live(job, member.id) == []
    settings.ENGINE = {**settings.ENGINE, "drain.graceful-close-timeout": 0}
    assert graceful_close.timeout_for(job) == 0  # off: moved at once, as before


def failed(job: Job) -> dict[int, str]:
    """The job's task groups failed so far: id -> the reason."""
    return {
        e.payload["taskGroupId"]: e.payload.get("error", "")
        for e in EngineEvent.objects.filter(kind="taskgroup.status", job_id=job.id)
        if e.payload["to"] == "FAILED"
    }


def expire(record: MemberDrain, seconds: float = -1.0) -> None:
    MemberDrain.objects.filter(id=record.id).update(
        expires_at=timezone.now() + timedelta(seconds=seconds)
    )


def test_a_drain_that_expires_moves_the_readers_that_closed(engine, settings):
    member = engine.add_member(slots=12)
    job = submit(engine, settings, True)
    engine.add_member(slots=12)
    record, _ = drain.request_drain(member.uuid, role_user("olga", "operator"), "upgrade")
    readers = sorted((g for g in live(job, member.id) if g.kind == "READER"), key=lambda g: g.index)
    drain.step(engine.epoch)
    report(readers[0], 7)  # closed: it reads no more, and never ends by itself
    expire(record)  # no master stepped before the expiry (a failover, say)
    did, stop = drain.step(engine.epoch)
    record.refresh_from_db()
    assert did and record.state == "EXPIRED"
    assert [t.task_group_id for t in stop] == [readers[0].id]  # its worker stops it
    assert "a reader had closed gracefully and the drain expired" in failed(job)[readers[0].id]
    still = {g.id for g in live(job, member.id)}
    assert readers[0].id not in still and readers[1].id in still  # the other one reads on


def test_the_wait_for_closes_ends_before_the_drain_expires(engine, settings):
    member = engine.add_member(slots=12)
    job = submit(engine, settings, True)
    engine.add_member(slots=12)
    record, _ = drain.request_drain(member.uuid, role_user("olga", "operator"), "upgrade")
    drain.step(engine.epoch)
    assert len(live(job, member.id)) == 3  # within the bound: waiting
    expire(record, graceful_close.EXPIRY_MARGIN / 2)
    drain.step(engine.epoch)
    record.refresh_from_db()
    assert live(job, member.id) == [] and record.state == "DRAINING"  # moved before expiry


@pytest.mark.parametrize("ends", ["closed", "expired"])
def test_an_enumerator_on_the_member_waits_for_its_readers_elsewhere(engine, settings, ends):
    member = engine.add_member(slots=12)
    job = submit(engine, settings, True)
    other = engine.add_member(slots=12)
    TaskGroup.objects.filter(job=job, kind="READER").update(member=other)  # readers elsewhere
    (enumerator,) = live(job, member.id)
    readers = sorted(live(job, other.id), key=lambda g: g.index)
    record, _ = drain.request_drain(member.uuid, role_user("olga", "operator"), "upgrade")
    sent: list = []
    drain.step(engine.epoch, sent.append)
    assert sorted(t.task_group_id for t in sent) == [g.id for g in readers]
    assert {t.member_uuid for t in sent} == {str(other.uuid)}
    assert live(job, member.id) == [enumerator]  # moving it would restore the pipeline
    report(readers[0], 7)
    if ends == "closed":
        report(readers[1], 8)
        drain.step(engine.epoch, sent.append)
    else:
        expire(record)
        drain.step(engine.epoch, sent.append)
        record.refresh_from_db()
        assert record.state == "EXPIRED"
    assert live(job, member.id) == []  # the enumerator moved: the whole pipeline restores
    assert enumerator.id in failed(job)


def test_a_reader_whose_input_ended_before_the_close_finishes():
    event_loop, box, _reader, _, _ = loop(size=3)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    send(box, CommandKind.NO_MORE_SPLITS)
    run_loop(event_loop)
    assert event_loop.input_ended and event_loop.close_latched
    task = ManagedReaderTask(SimpleNamespace(attempt=2), SimpleNamespace(id=5), WorkerBudget(10**9))
    task.closing = True  # the drain's close, admitted after its poll ended the input
    commits = ReaderCommits(5, 2, 1, checkpointing=False, restored=None)
    assert task._may_close(commits, None, None, event_loop, None)  # it ends, as at its end


def test_a_reader_task_admits_the_close_once_in_reserved_capacity():
    task = ManagedReaderTask(SimpleNamespace(attempt=2), SimpleNamespace(id=5), WorkerBudget(10**9))
    assert not task.close_gracefully()  # still starting: the master sends it again
    limits = MailboxLimits(max_commands=2, reserved_commands=1)
    task.mailbox = ReaderMailbox(1, "1/0", 2, limits, WorkerBudget(10**9))
    answers = [task.mailbox.admit(assignment(task.mailbox, n)).status for n in (1, 2)]
    assert answers == [AdmissionStatus.ACCEPTED, AdmissionStatus.RETRY_LATER]  # normal: full
    assert task.close_gracefully() and task.close_gracefully()  # the repeat: acknowledged
    kinds = []
    while (queued := task.mailbox.take()) is not None:
        kinds.append(queued.envelope.kind)
    assert kinds == [CommandKind.ASSIGN_SPLITS, CommandKind.GRACEFUL_CLOSE]
    assert task._close_report() == {"gracefulClose": {"attempt": 2, "checkpoint": None}}


def assignment(mailbox: ReaderMailbox, n: int) -> SourceCommandEnvelope:
    return SourceCommandEnvelope.build(
        job_id=mailbox.job_id,
        source_runtime_id=mailbox.runtime_id,
        epoch=0,
        sender_attempt=1,
        target_attempt=mailbox.attempt,
        sequence=n,
        command_id=f"split-{n}",
        kind=CommandKind.ASSIGN_SPLITS,
        payload=b'{"splits": []}',
    )
