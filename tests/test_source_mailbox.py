"""The reader mailbox admits in the design's order, stays within its bounds, keeps capacity for
checkpoint-path controls, lets the terminal signal through when full, and dedupes by command id
and by applied sender watermarks."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sourceruntime import (
    AdmissionStatus,
    CommandKind,
    MailboxLimits,
    ReaderMailbox,
    SourceCommandEnvelope,
    WorkerBudget,
)
from engine.sourceruntime.choices import Category

LIMITS = MailboxLimits(
    max_commands=6, max_bytes=600, reserved_commands=2, reserved_bytes=100, max_payload=300
)


def mailbox(budget: WorkerBudget | None = None, **kw) -> ReaderMailbox:
    woken = []
    box = ReaderMailbox(
        7,
        "7/1",
        attempt=2,
        limits=LIMITS,
        budget=budget or WorkerBudget(10_000),
        wakeup=lambda: woken.append(1),
        **kw,
    )
    box.woken = woken
    return box


_ids = iter(range(10**9))


def command(kind=CommandKind.ASSIGN_SPLITS, payload=b"x" * 10, seq=None, **changes):
    n = next(_ids)
    env = SourceCommandEnvelope.build(
        job_id=7,
        source_runtime_id="7/1",
        epoch=1,
        sender_attempt=1,
        target_attempt=2,
        sequence=n if seq is None else seq,
        command_id=f"c{n}",
        kind=kind,
        payload=payload,
    )
    return replace(env, **changes) if changes else env


@pytest.mark.parametrize(
    "changes,status,reason",
    [
        ({"protocolVersion": 2, "targetAttemptId": 9}, "UNSUPPORTED_PROTOCOL", "PROTOCOL_MAJOR"),
        ({"targetAttemptId": 1, "payloadChecksum": "bad"}, "STALE_TARGET", "STALE_ATTEMPT"),
        ({"sourceRuntimeId": "7/2"}, "STALE_TARGET", "WRONG_RUNTIME"),
        ({"payloadChecksum": "bad"}, "INVALID_PAYLOAD", "CHECKSUM_MISMATCH"),
        ({"payloadBytes": 3}, "INVALID_PAYLOAD", "SIZE_MISMATCH"),
        ({"durability": "EPHEMERAL"}, "INVALID_PAYLOAD", "DURABILITY_MISMATCH"),
        ({"commandKind": "NOPE"}, "INVALID_PAYLOAD", "UNKNOWN_KIND"),
        ({"payloadVersion": 9}, "INVALID_PAYLOAD", "UNSUPPORTED_PAYLOAD_VERSION"),
    ],
)
def test_validation_comes_first_in_the_design_s_order(changes, status, reason):
    box = mailbox()
    ack = box.admit(command(**changes))
    assert (ack.status.value, ack.reasonCode) == (status, reason)
    assert ack.mailboxSequence is None and box.commands == 0 and not box.woken


def test_a_payload_over_the_limit_is_invalid():
    ack = mailbox().admit(command(payload=b"x" * 301))
    assert (ack.status, ack.reasonCode) == (AdmissionStatus.INVALID_PAYLOAD, "PAYLOAD_TOO_LARGE")


def test_accepted_means_reserved_sequenced_and_published():
    box = mailbox()
    acks = [box.admit(command()) for _ in range(3)]
    assert [a.mailboxSequence for a in acks] == [1, 2, 3]
    assert all(a.status == AdmissionStatus.ACCEPTED and a.targetAttemptId == 2 for a in acks)
    assert (box.commands, box.bytes, len(box.woken)) == (3, 30, 3)
    assert [box.take().sequence for _ in range(3)] == [1, 2, 3]
    assert box.take() is None and (box.commands, box.bytes) == (0, 0)


def test_a_full_mailbox_answers_retry_later_but_keeps_room_for_checkpoint_controls():
    box = mailbox()
    for _ in range(4):  # 6 commands, 2 of them reserved
        assert box.admit(command()).status == AdmissionStatus.ACCEPTED
    full = box.admit(command())
    assert (full.status, full.retryAfterMillis, full.reasonCode) == (
        AdmissionStatus.RETRY_LATER,
        10,
        "MAILBOX_FULL",
    )
    for kind in (CommandKind.CHECKPOINT, CommandKind.GRACEFUL_CLOSE):
        assert box.admit(command(kind=kind)).status == AdmissionStatus.ACCEPTED
    assert box.stats()["reservedInUse"] == 2
    # Reserved capacity exhausted by a checkpoint-path control: an invariant violation.
    ack = box.admit(command(kind=CommandKind.CHECKPOINT_COMPLETE))
    assert (ack.status, ack.reasonCode) == (
        AdmissionStatus.TERMINAL_REJECTED,
        "RESERVED_CAPACITY_EXHAUSTED",
    )
    assert box.terminal.kind == CommandKind.FATAL


def test_payload_bytes_bound_the_mailbox_and_the_worker():
    box = mailbox()
    assert box.admit(command(payload=b"x" * 300)).status == AdmissionStatus.ACCEPTED
    assert box.admit(command(payload=b"x" * 200)).status == AdmissionStatus.ACCEPTED
    assert box.admit(command(payload=b"x" * 1)).status == AdmissionStatus.RETRY_LATER  # 500 max
    budget = WorkerBudget(250)
    one, two = mailbox(budget), mailbox(budget)
    assert one.admit(command(payload=b"x" * 200)).status == AdmissionStatus.ACCEPTED
    assert two.admit(command(payload=b"x" * 100)).status == AdmissionStatus.RETRY_LATER
    one.take()
    assert two.admit(command(payload=b"x" * 100)).status == AdmissionStatus.ACCEPTED
    assert budget.used == 100


def test_the_terminal_signal_gets_through_a_full_mailbox_and_preempts():
    box = mailbox()
    while box.admit(command()).status == AdmissionStatus.ACCEPTED:
        pass
    woken = len(box.woken)
    ack = box.admit(command(kind=CommandKind.CANCEL, payload=b""))
    assert ack.status == AdmissionStatus.ACCEPTED and box.terminal.kind == CommandKind.CANCEL
    assert len(box.woken) > woken  # wakeup(): a poll in progress returns
    late = box.admit(command())
    assert (late.status, late.reasonCode) == (AdmissionStatus.TERMINAL_REJECTED, "COMMAND")
    assert not box.signal_terminal(CommandKind.FATAL, "other")  # the first one stands


def test_duplicates_are_answered_with_the_first_admission_and_after_apply():
    box = mailbox()
    first = command(seq=0)
    assert box.admit(first).mailboxSequence == 1
    again = box.admit(first)
    assert (again.status, again.mailboxSequence) == (AdmissionStatus.DUPLICATE, 1)
    box.applied(box.take().envelope)
    after = box.admit(first)
    assert (after.status, after.reasonCode) == (AdmissionStatus.DUPLICATE, "APPLIED")
    # A redelivery under a new command id of an applied sender sequence is a duplicate too.
    assert box.admit(replace(first, commandId="other")).status == AdmissionStatus.DUPLICATE


def test_applied_watermarks_keep_their_gaps_and_survive_a_restore():
    box = mailbox()
    for seq in (0, 1, 3, 5):
        box.applied(command(seq=seq))
    assert box.watermarks() == {"1": {"upto": 1, "above": [3, 5]}}
    fresh = mailbox()
    fresh.restore_watermarks(box.watermarks())
    assert fresh.admit(command(seq=3)).status == AdmissionStatus.DUPLICATE
    assert fresh.admit(command(seq=2)).status == AdmissionStatus.ACCEPTED


def test_an_older_coordinator_epoch_is_fenced():
    box = mailbox()
    assert box.admit(command(coordinatorEpoch=3)).status == AdmissionStatus.ACCEPTED
    stale = box.admit(command(coordinatorEpoch=2))
    assert (stale.status, stale.reasonCode) == (AdmissionStatus.STALE_TARGET, "STALE_EPOCH")


def test_ordered_controls_before_completions_before_observability():
    box = mailbox()
    box.admit(command(kind=CommandKind.DIAGNOSTIC, payload=b""))
    available = command(kind=CommandKind.AVAILABLE, payload=b"")
    box.admit(available)
    box.admit(replace(available, senderSequence=available.senderSequence + 10**6))  # coalesced
    box.admit(command(kind=CommandKind.ASSIGN_SPLITS))
    box.admit(command(kind=CommandKind.CHECKPOINT, payload=b""))
    order = [box.take().category for _ in range(4)]
    assert order == [
        Category.ORDERED_CONTROL,
        Category.ORDERED_CONTROL,
        Category.ASYNC_COMPLETION,
        Category.OBSERVABILITY,
    ]
    assert box.take() is None


def test_the_wire_form_round_trips_and_a_tampered_payload_is_invalid():
    env = command(payload=b'{"splits": ["a"]}')
    assert SourceCommandEnvelope.from_wire(env.to_wire()) == env
    wire = json.loads(env.to_wire())
    wire["payload"] = base64.b64encode(b'{"splits": ["b"]}').decode()  # same size, other bytes
    tampered = SourceCommandEnvelope.from_wire(json.dumps(wire))
    assert mailbox().admit(tampered).reasonCode == "CHECKSUM_MISMATCH"
    with pytest.raises(ValueError):
        SourceCommandEnvelope.from_wire('{"wire": 99}')


def test_stats_report_the_queue():
    now = [100.0]
    box = mailbox(clock=lambda: now[0])
    box.admit(command())
    now[0] += 0.25
    assert box.stats() == {
        "commands": 1,
        "bytes": 10,
        "reservedInUse": 0,
        "oldestAgeMs": 250,
        "admissions": {"ACCEPTED": 1},
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "take", "apply"]),
            st.sampled_from(list(CommandKind)),
            st.integers(0, 120),
        ),
        max_size=60,
    )
)
def test_the_bounds_hold_whatever_happens(ops):
    budget = WorkerBudget(400)
    box = mailbox(budget)
    taken = []
    for op, kind, size in ops:
        if op == "admit" and kind not in (CommandKind.CANCEL, CommandKind.FATAL):
            box.admit(command(kind=kind, payload=b"x" * size))
        elif op == "take" and (item := box.take()) is not None:
            taken.append(item)
        elif op == "apply" and taken:
            box.applied(taken.pop(0).envelope)
        assert 0 <= box.commands <= LIMITS.max_commands
        assert 0 <= box.bytes <= LIMITS.max_bytes
        assert 0 <= box.reserved_commands <= LIMITS.reserved_commands
        assert 0 <= budget.used <= budget.max_bytes
        assert budget.used == box.bytes - box.reserved_bytes
    sequences = [q.sequence for q in taken if q.category == Category.ORDERED_CONTROL]
    assert sequences == sorted(sequences)
