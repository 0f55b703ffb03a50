"""A Lane A enumerator assigns only to registered reader attempts, reconciled first, and moves
their assignments by what the readers tell it: APPLIED by an assignment acknowledgement of
that attempt, CHECKPOINT_INCLUDED by a snapshot report whose metadata proves it, back by the
master's abort, GC_ELIGIBLE by the completed checkpoint's own metadata. Stepped by hand."""

from __future__ import annotations

import time

from engine.member.enumerator_link import ASSIGNMENT_ACK, SNAPSHOT
from engine.member.mailbox import Abort
from engine.member.managed_enumerator import REGISTRATION_GRACE
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.discovery import FixedSplits
from engine.sourceruntime.limits import MailboxLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from tests.test_source_enumerator_task import (
    EPOCH,
    answer,
    enumerator,
    register,
    run_loop,
    splits,
)


def assignments(outbox) -> list:
    return [e for e in outbox.envelopes() if e.kind == CommandKind.ASSIGN_SPLITS]


def start(task, n: int) -> None:
    task.discovery = FixedSplits(task.loop, task._on_new, splits(n))
    task.discovery.start()
    run_loop(task)


def test_nothing_is_assigned_before_every_reader_registered_and_was_confirmed():
    task, outbox = enumerator(registered=False)
    start(task, 4)
    assert assignments(outbox) == []
    first = register(task, outbox, 0)
    assert first.payload and b"worker-e" in first.payload  # where its messages go
    answer(task, first)
    assert assignments(outbox) == []  # reader 1 is still starting
    confirmation = register(task, outbox, 1)
    assert assignments(outbox) == []  # not until its confirmation is admitted
    answer(task, confirmation)
    sent = assignments(outbox)
    assert sorted(e.targetAttemptId for e in sent) == [EPOCH] * 4
    assert {e.senderSequence for e in sent} == {1, 2}  # each reader's, after its confirmation


def test_past_the_grace_the_registered_readers_take_the_splits():
    task, outbox = enumerator(registered=False)
    start(task, 3)
    answer(task, register(task, outbox, 1))
    task.started = time.monotonic() - REGISTRATION_GRACE - 0.1
    task._resend_tick()
    sent = assignments(outbox)
    assert {e.commandId.split(":")[-1] for e in sent} == {"s000", "s001", "s002"}
    assert {queue for _, _, queue in outbox.sent} == {"member.worker-1"}  # reader 1's only


def test_a_stale_or_repeated_registration_changes_nothing():
    task, outbox = enumerator(registered=False)
    assert register(task, outbox, 0, attempt=EPOCH - 1) is None  # older than the pipeline's
    assert register(task, outbox, 0) is not None
    assert register(task, outbox, 0) is None  # its confirmation is out already
    assert 0 not in task.ready and task.targets[0].attempt == EPOCH


def test_a_newer_attempt_keeps_what_its_metadata_proves_and_takes_the_rest_back():
    """Reader 0's attempt applied its confirmation (0) and s000 (1), not s002 (2); its next
    attempt, restored from a checkpoint that holds that, registers: s000 is its own, s002 is
    assigned again, and its sequences go on above what it applied."""
    task, outbox = enumerator()
    start(task, 4)
    for envelope in assignments(outbox):
        answer(task, envelope)
    restored = {
        "readerAttemptLineage": [EPOCH],
        "appliedSenderWatermarks": {str(EPOCH): {"upto": 1, "above": []}},
    }
    outbox.sent.clear()
    confirmation = register(task, outbox, 0, attempt=EPOCH + 1, metadata=restored)
    assert confirmation.senderSequence == 2 and confirmation.targetAttemptId == EPOCH + 1
    assert "s000" not in task.tracker.entries and list(task.pending) == ["s002"]
    assert 0 not in task.ready and assignments(outbox) == []
    answer(task, confirmation)
    (again,) = assignments(outbox)
    assert again.commandId.endswith("s002") and again.senderSequence == 3
    # The new attempt's mailbox, with the restored watermark: the confirmation settles the
    # gap below it, so the assignment after it compacts the watermark.
    box = ReaderMailbox(1, "1/0", EPOCH + 1, MailboxLimits(), WorkerBudget(10**9))
    box.restore_watermarks(restored["appliedSenderWatermarks"])
    for envelope in (confirmation, again):
        assert box.admit(envelope).status == AdmissionStatus.ACCEPTED
        box.applied(box.take().envelope)
    assert box.watermarks() == {str(EPOCH): {"upto": 3, "above": []}}


def test_acknowledgements_reports_and_aborts_move_assignments_by_attempt_and_proof():
    task, outbox = enumerator()
    start(task, 2)
    for envelope in assignments(outbox):
        answer(task, envelope)
    counts = task.tracker.counts
    ack = {"kind": ASSIGNMENT_ACK, "reader": 0, "splits": ["s000"]}
    task._on_ack({**ack, "attempt": EPOCH - 1})  # a stale attempt's
    assert counts()["APPLIED"] == 0
    task._on_ack({**ack, "attempt": EPOCH})
    assert counts()["APPLIED"] == 1 and counts()["ADMITTED"] == 1
    metadata = {
        "readerAttemptLineage": [EPOCH],
        "appliedSenderWatermarks": {str(EPOCH): {"upto": 1, "above": []}},
    }
    report = {"kind": SNAPSHOT, "reader": 0, "attempt": EPOCH, "metadata": metadata}
    task._on_ack({**report, "checkpoint": 7})
    assert counts()["CHECKPOINT_INCLUDED"] == 1
    task._on_message(Abort(7))  # the master's: checkpoint 7 failed
    run_loop(task)
    assert counts()["APPLIED"] == 1 and counts()["CHECKPOINT_INCLUDED"] == 0
    task._on_ack({**report, "checkpoint": 8})
    task._on_completed((8, {0: metadata, 1: None}), None)
    assert counts()["ADMITTED"] == 1 and set(task.tracker.entries) == {"s001"}
    task._on_ack({**report, "checkpoint": 8})  # late: that checkpoint is settled
    assert counts()["CHECKPOINT_INCLUDED"] == 0
    reached = task.tracker.reached
    assert reached["APPLIED"] == 1 and reached["CHECKPOINT_INCLUDED"] == 2
    assert reached["GC_ELIGIBLE"] == 1
