"""The enumerator keeps a split's description only while the split is pending or tracked: once
its tracker entry leaves for good (admitted with no checkpoint to prove it, or proven by a
reader's registration metadata) the description goes too, so the enumerator's memory does not
grow with the input."""

from __future__ import annotations

from engine.member.managed_enumerator import SEND_WINDOW
from engine.sourceruntime.discovery import FixedSplits
from tests.test_source_enumerator_task import (
    EPOCH,
    answer,
    enumerator,
    register,
    run_loop,
    splits,
)


def test_splits_proven_at_a_reader_s_registration_leave_their_descriptions():
    task, outbox = enumerator(readers=1)
    task.discovery = FixedSplits(task.loop, task._on_new, splits(SEND_WINDOW + 2))
    task.discovery.start()
    run_loop(task)
    sent = outbox.envelopes()
    for envelope in sent:
        answer(task, envelope)
    assert len(task.tracker.entries) == len(task.splits) == SEND_WINDOW + 2
    # The reader restored alone: its new attempt's metadata proves its first two assignments
    # (the confirmation was its sequence 0); the rest go back to the pending splits.
    proven = [e.senderSequence for e in sent[:2]]
    metadata = {
        "readerAttemptLineage": [EPOCH, EPOCH + 1],
        "appliedSenderWatermarks": {str(EPOCH): {"upto": max(proven), "above": []}},
    }
    register(task, outbox, 0, attempt=EPOCH + 1, metadata=metadata)
    gone = {s["splitId"] for s in splits(2)}
    assert not gone & set(task.tracker.entries) and not gone & set(task.pending)
    assert set(task.splits) == {*task.pending, *task.tracker.entries}
    assert not gone & set(task.splits) and len(task.splits) == SEND_WINDOW
