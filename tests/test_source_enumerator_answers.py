"""The Lane A enumerator task's handling of silence and of answers from the wrong reader,
stepped by hand (tests/test_source_enumerator_task.py's harness): a command nothing answers
goes again at a doubling interval up to RESEND_CAP, back to RESEND_AFTER once answered; an
assignment acknowledgement is fenced by reader and attempt, so another reader's attempt of the
same number cannot let no-more-splits overtake an unadmitted assignment."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

from engine.member import managed_enumerator
from engine.member.enumerator_link import ASSIGNMENT_ACK
from engine.member.managed_enumerator import RESEND_AFTER, RESEND_CAP
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.discovery import FixedSplits
from tests.test_source_enumerator_task import EPOCH, answer, enumerator, run_loop, splits


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def assigned(task, outbox, n: int) -> list:
    task.discovery = FixedSplits(task.loop, task._on_new, splits(n))
    task.discovery.start()
    run_loop(task)
    return [e for e in outbox.envelopes() if e.kind == CommandKind.ASSIGN_SPLITS]


def test_a_silent_readers_command_goes_again_ever_less_often_until_answered(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(
        managed_enumerator, "time", SimpleNamespace(monotonic=clock, time=time.time)
    )
    task, outbox = enumerator(readers=1, batch=False)
    [command] = assigned(task, outbox, 1)
    sent_at = [clock.now]
    start = clock.now
    while clock.now < start + 60:  # a dead reader: nothing ever answers
        clock.now = round(clock.now + 0.1, 1)
        before = len(outbox.sent)
        task._resend_tick()
        if len(outbox.sent) > before:
            sent_at.append(clock.now)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(sent_at)]
    assert gaps[:4] == [RESEND_AFTER, 2 * RESEND_AFTER, 4 * RESEND_AFTER, RESEND_CAP]
    assert set(gaps[3:]) == {RESEND_CAP}  # not every second for ever
    # An answer (the reader is there, its mailbox full) resets it: after its backoff, the
    # silence wait is RESEND_AFTER again.
    answer(task, command, AdmissionStatus.RETRY_LATER, retryAfterMillis=500)
    answered, sent_at = clock.now, []
    while clock.now < answered + 2.5:
        clock.now = round(clock.now + 0.1, 1)
        before = len(outbox.sent)
        task._resend_tick()
        if len(outbox.sent) > before:
            sent_at.append(round(clock.now - answered, 1))
    assert sent_at[0] >= 0.5 and round(sent_at[1] - sent_at[0], 1) == RESEND_AFTER
    answer(task, command)
    assert task.outstanding == {}


def test_another_readers_acknowledgement_does_not_let_no_more_splits_overtake():
    """Readers 0 and 1 both run attempt EPOCH: reader 1 acknowledging reader 0's split (a late
    one, from before the split went to reader 0) leaves it unadmitted."""
    task, outbox = enumerator(readers=2, batch=True)
    sent = {task.outstanding[e.commandId].reader: e for e in assigned(task, outbox, 2)}
    zero_split = task.outstanding[sent[0].commandId].split_id
    answer(task, sent[1])  # reader 1's own split is admitted
    task._on_ack({"kind": ASSIGNMENT_ACK, "reader": 1, "attempt": EPOCH, "splits": [zero_split]})
    assert task.tracker.entries[zero_split].state.value == "DISPATCHED"
    assert CommandKind.NO_MORE_SPLITS not in {e.kind for e in outbox.envelopes()}
    answer(task, sent[0])  # now every assignment is admitted: no-more-splits follows them
    assert CommandKind.NO_MORE_SPLITS in {e.kind for e in outbox.envelopes()}
