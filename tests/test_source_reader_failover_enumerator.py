"""The enumerator of a pipeline whose reader was restored alone learns the reader's new attempt
without being restored itself: a STALE_TARGET answer (a command reached a newer attempt) makes
it look the readers up on its shared pool and send the replaced attempt nothing more; the new
attempt's registration returns what its restored metadata does not prove to the pending splits,
restarts its sequences and takes assignments again. Real task groups on PostgreSQL (restored by
the engine's own steps), the enumerator task stepped by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.member.enumerator_link import REGISTER
from engine.member.enumerator_readers import readers_of
from engine.member.managed_enumerator import REGISTRATION_GRACE, ManagedEnumeratorTask
from engine.models import TaskGroup
from engine.sourceruntime.choices import AdmissionStatus, AssignmentState, CommandKind
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.sourceruntime.discovery import FixedSplits
from tests.clusterkit import wait_for
from tests.test_source_enumerator_task import RecordingOutbox, answer, run_loop, splits
from tests.test_source_reader_failover_rollup import group, lane_a, running

__all__ = ["lane_a"]

pytestmark = pytest.mark.django_db(transaction=True)


def register(task: ManagedEnumeratorTask, reader: TaskGroup, metadata: dict):
    """The reader attempt's registration (engine.member.enumerator_link); the confirmation."""
    reader.refresh_from_db()
    sent = len(task.outbox.sent)
    task._on_ack(
        {
            "kind": REGISTER,
            "reader": reader.index,
            "taskGroupId": reader.id,
            "attempt": reader.attempt,
            "memberUuid": str(reader.member.uuid),
            "memberName": reader.member.name,
            "metadata": metadata,
        }
    )
    (confirmation,) = task.outbox.envelopes()[-1:] if len(task.outbox.sent) > sent else [None]
    return confirmation


def fresh(attempt: int) -> dict:
    """A reader attempt's metadata with no checkpoint to restore from: it proves nothing."""
    return {"readerAttemptLineage": [attempt], "appliedSenderWatermarks": {}}


def test_a_reader_restored_alone_is_reconciled_and_assigned_again(engine, lane_a):
    job = running(engine)
    enumerator = group(job, "ENUMERATOR")
    outbox = RecordingOutbox()
    thread = SimpleNamespace(attempt=enumerator.attempt, first_barrier=lambda message: False)
    task = ManagedEnumeratorTask(thread, enumerator, SharedWorkerPool(1), outbox)
    task.bind(
        readers_of(enumerator.pipeline_id),
        batch=False,
        checkpointing=True,
        runtime=f"{job.id}/1",
        reply=[enumerator.id, enumerator.attempt, "uuid-e", "worker-e"],
    )
    task.loop = CoordinatorEventLoop(task.pool, epoch=enumerator.attempt)
    task.started -= REGISTRATION_GRACE  # running for a while: no grace for starting readers
    readers = [group(job, "READER", i) for i in (0, 1)]
    for reader in readers:
        answer(task, register(task, reader, fresh(1)))
    task.discovery = FixedSplits(task.loop, task._on_new, splits(4))
    task.discovery.start()
    run_loop(task)
    assert sum(e.kind == CommandKind.ASSIGN_SPLITS for e in outbox.envelopes()) == 4
    lost = [c for c, o in task.outstanding.items() if o.reader == 0]
    for command_id, command in list(task.outstanding.items()):
        if command.reader == 1:
            answer(task, next(e for e in outbox.envelopes() if e.commandId == command_id))

    engine.lose(readers[0].member)  # reader 0's worker dies before it admitted anything
    engine.fail_lost()
    assert engine.restore_due() == ["restored"]
    assert group(job, "READER", 0).attempt == 2 and group(job, "ENUMERATOR").attempt == 1

    # A command to the old attempt reaches the worker of the new one: STALE_TARGET.
    task._on_ack(
        {
            "commandId": lost[0],
            "ack": {"status": AdmissionStatus.STALE_TARGET.value, "reasonCode": "STALE_ATTEMPT"},
        }
    )
    wait_for(
        lambda: run_loop(task) or task.expected[0].attempt == 2,
        10,
        interval=0.02,
        what="the readers looked up on the shared pool",
    )
    assert 0 not in task.ready and not [o for o in task.outstanding.values() if o.reader == 0]
    outbox.sent.clear()
    task._on_new(splits(6)[4:])  # new files: reader 1's only, while reader 0 restores
    targets = {e.targetAttemptId for e in outbox.envelopes()}
    assert len(outbox.envelopes()) == 2 and targets == {1}
    assert all(e.commandId.split(":")[0] == "assign" for e in outbox.envelopes())
    assert {outbox.sent[0][2], outbox.sent[1][2]} == {f"member.{readers[1].member.name}"}

    outbox.sent.clear()
    confirmation = register(task, readers[0], fresh(2))  # restored: it proves nothing
    assert confirmation.kind == CommandKind.REGISTER and confirmation.targetAttemptId == 2
    assert sorted(task.pending) == sorted(lost_splits := [c.rsplit(":", 1)[1] for c in lost])
    answer(task, confirmation)
    again = [e for e in outbox.envelopes() if e.kind == CommandKind.ASSIGN_SPLITS]
    assert sorted(e.commandId.rsplit(":", 1)[1] for e in again) == sorted(lost_splits)
    assert {e.targetAttemptId for e in again} <= {1, 2} and not task.pending
    # Every split is tracked once, for one current attempt.
    entries = task.tracker.entries
    assert sorted(entries) == [f"s{i:03d}" for i in range(6)]
    current = {0: 2, 1: 1}
    assert all(current[e.reader] == e.attempt for e in entries.values())
    assert all(e.state != AssignmentState.UNASSIGNED for e in entries.values())
