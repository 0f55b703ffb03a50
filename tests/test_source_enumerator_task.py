"""The Lane A enumerator task, stepped by hand: what it sends (through an outbox that records),
how it takes admission answers, how a restore reconciles its cut with what the readers'
metadata proves, and, on PostgreSQL, what a reader's snapshot proves as of a checkpoint it owed
no ack (it had FINISHED)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine.member.enumerator_link import REGISTER
from engine.member.managed_enumerator import SEND_WINDOW, ManagedEnumeratorTask, Target
from engine.protocol import TASK_SOURCE_COMMAND
from engine.sourceruntime.choices import AdmissionStatus, AssignmentState, CommandKind
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.sourceruntime.discovery import FixedSplits
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.limits import MailboxLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.tracker import AssignmentTracker

EPOCH = 3


class RecordingOutbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list, str]] = []
        self.batchable: list[bool] = []  # each one's ``batch``, in the order sent

    def put(self, task: str, args: list, queue: str, batch: bool = False) -> None:
        self.sent.append((task, args, queue))
        self.batchable.append(batch)

    def envelopes(self) -> list[SourceCommandEnvelope]:
        return [
            SourceCommandEnvelope.from_wire(a[3])
            for t, a, _ in self.sent
            if t == TASK_SOURCE_COMMAND
        ]


def enumerator(
    readers: int = 2, *, batch: bool = True, checkpointing: bool = True, registered: bool = True
):
    """An enumerator task of ``readers`` readers, each registered (and its confirmation
    admitted) unless not ``registered``; the outbox then holds nothing yet."""
    outbox = RecordingOutbox()
    thread = SimpleNamespace(attempt=EPOCH, first_barrier=lambda message: False)
    group = SimpleNamespace(id=10, job_id=1, pipeline_id=5)
    task = ManagedEnumeratorTask(thread, group, SharedWorkerPool(1), outbox)
    task.bind(
        [Target(i, 100 + i, EPOCH, f"uuid-{i}", f"worker-{i}") for i in range(readers)],
        batch=batch,
        checkpointing=checkpointing,
        runtime="1/0",
        reply=[10, EPOCH, "uuid-e", "worker-e"],
    )
    task.loop = CoordinatorEventLoop(task.pool, epoch=EPOCH)
    if registered:
        for index in range(readers):
            answer(task, register(task, outbox, index))
        outbox.sent.clear()
    return task, outbox


def register(task, outbox, index: int, attempt: int = EPOCH, metadata: dict | None = None):
    """Reader ``index``'s attempt registers (as engine.member.enumerator_link does); returns
    the confirmation sent, if any."""
    sent = len(outbox.sent)
    task._on_ack(
        {
            "kind": REGISTER,
            "reader": index,
            "taskGroupId": 100 + index,
            "attempt": attempt,
            "memberUuid": f"uuid-{index}",
            "memberName": f"worker-{index}",
            "metadata": metadata or {},
        }
    )
    confirmations = [
        SourceCommandEnvelope.from_wire(args[3])
        for task_name, args, _ in outbox.sent[sent:]
        if task_name == TASK_SOURCE_COMMAND
    ]
    assert all(c.kind == CommandKind.REGISTER for c in confirmations)
    return confirmations[0] if confirmations else None


def splits(n: int) -> list[dict]:
    return [{"splitId": f"s{i:03d}", "index": i} for i in range(n)]


def run_loop(task) -> None:
    while task.loop.step():
        pass


def answer(task, envelope: SourceCommandEnvelope, status=AdmissionStatus.ACCEPTED, **ack) -> None:
    task._on_ack({"commandId": envelope.commandId, "ack": {"status": status.value, **ack}})


def test_each_reader_gets_gapless_sequences_from_zero_and_its_watermark_compacts():
    task, outbox = enumerator(registered=False)
    confirmations = [register(task, outbox, r) for r in (0, 1)]
    assert [c.senderSequence for c in confirmations] == [0, 0]  # each reader's first
    for confirmation in confirmations:
        answer(task, confirmation)
    task.discovery = FixedSplits(task.loop, task._on_new, splits(6))
    task.discovery.start()
    run_loop(task)
    sent = [e for e in outbox.envelopes() if e.kind == CommandKind.ASSIGN_SPLITS]
    by_reader = {
        r: [
            e.senderSequence
            for e in sent
            if e.targetAttemptId == EPOCH and json.loads(e.payload)["splits"][0]["index"] % 2 == r
        ]
        for r in (0, 1)
    }
    assert by_reader == {0: [1, 2, 3], 1: [1, 2, 3]}  # round-robin, after the confirmation
    mailbox = ReaderMailbox(1, "1/0", EPOCH, MailboxLimits(), WorkerBudget(10**9))
    for envelope in [confirmations[0], *sent[::2]]:  # reader 0's
        assert mailbox.admit(envelope).status == AdmissionStatus.ACCEPTED
    while (queued := mailbox.take()) is not None:
        mailbox.applied(queued.envelope)
    assert mailbox.watermarks() == {str(EPOCH): {"upto": 3, "above": []}}


def test_no_more_splits_goes_out_once_everything_is_admitted_even_if_nothing_was_found():
    task, outbox = enumerator()
    task.discovery = FixedSplits(task.loop, task._on_new, [])
    task.discovery.start()
    run_loop(task)
    task._resend_tick()  # the loop's own tick: a discovery complete with nothing new
    kinds = [e.kind for e in outbox.envelopes()]
    assert kinds == [CommandKind.NO_MORE_SPLITS, CommandKind.NO_MORE_SPLITS]

    task, outbox = enumerator()
    task.discovery = FixedSplits(task.loop, task._on_new, splits(2))
    task.discovery.start()
    run_loop(task)
    first = outbox.envelopes()
    assert [e.kind for e in first] == [CommandKind.ASSIGN_SPLITS] * 2
    answer(task, first[0])
    assert len(outbox.envelopes()) == 2  # one assignment not admitted yet: nothing else
    answer(task, first[1], AdmissionStatus.DUPLICATE)  # its answer to a resend
    assert [e.kind for e in outbox.envelopes()[2:]] == [CommandKind.NO_MORE_SPLITS] * 2


def test_a_reader_has_at_most_a_window_of_unadmitted_assignments():
    task, outbox = enumerator(readers=2)
    task.discovery = FixedSplits(task.loop, task._on_new, splits(3 * SEND_WINDOW))
    task.discovery.start()
    run_loop(task)
    sent = outbox.envelopes()
    assert len(sent) == 2 * SEND_WINDOW and len(task.pending) == SEND_WINDOW
    answer(task, sent[0])  # one admitted: one more goes out, to the reader with room
    assert len(outbox.envelopes()) == 2 * SEND_WINDOW + 1
    assert outbox.sent[-1][2] == outbox.sent[0][2]  # the same reader's queue
    answer(task, sent[1], AdmissionStatus.RETRY_LATER, retryAfterMillis=50)
    assert task.outstanding[sent[1].commandId].backoff == pytest.approx(0.05)
    assert len(outbox.envelopes()) == 2 * SEND_WINDOW + 1  # a refusal opens no room


def test_without_checkpoints_an_admitted_assignment_leaves_the_tracker_and_no_description():
    task, outbox = enumerator(checkpointing=False, batch=False)
    task.discovery = FixedSplits(task.loop, task._on_new, splits(4))
    task.discovery.start()
    run_loop(task)
    for envelope in outbox.envelopes():
        answer(task, envelope)
    assert task.tracker.entries == {} and task.tracker.bytes == 0 and task.splits == {}


def test_a_payload_refused_as_invalid_fails_the_task_instead_of_being_resent_for_ever():
    task, outbox = enumerator()
    task.discovery = FixedSplits(task.loop, task._on_new, splits(1))
    task.discovery.start()
    run_loop(task)
    with pytest.raises(RuntimeError, match="INVALID_PAYLOAD PAYLOAD_TOO_LARGE"):
        answer(
            task,
            outbox.envelopes()[0],
            AdmissionStatus.INVALID_PAYLOAD,
            reasonCode="PAYLOAD_TOO_LARGE",
        )


def test_a_restore_gives_readers_what_their_metadata_proves_and_returns_the_rest():
    """The cut (epoch 2, readers' attempts 2): s1 admitted by reader 1 (its sequence 0), s2
    applied (0) and s3 dispatched (1) to reader 0, s4 pending; s5 was assigned to reader 0 after
    the cut (2). Reader 0's snapshot applied sequences 0 and 2 (a gap at 1), and names s2 and s5
    as recent; reader 1's applied 0. Restored: s3 and s4 are pending again, s5 is known (never
    handed on twice): nothing is read from the readers' connector state."""
    old = EPOCH - 1
    cut = AssignmentTracker()
    for split_id, reader, sequence in (("s1", 1, 0), ("s2", 0, 0), ("s3", 0, 1)):
        cut.dispatch(split_id, 10, reader, old, old, sequence)
    cut.admitted("s1", 1, old)
    cut.applied("s2", 0, old)
    described = {s: {"splitId": s} for s in ("s1", "s2", "s3", "s4")}
    own = {
        "enumeratorStateVersion": 1,
        "tracker": cut.to_json(),
        "pending": ["s4"],
        "splits": described,
        "known": ["s1", "s2", "s3", "s4"],
        "epoch": old,
    }
    reader0 = {
        "readerAttemptLineage": [old],
        "appliedSenderWatermarks": {str(old): {"upto": 0, "above": [2]}},
        "recentAssignments": [[old, 0, ["s2"]], [old, 2, ["s5"]]],
    }
    reader1 = {
        "readerAttemptLineage": [old],
        "appliedSenderWatermarks": {str(old): {"upto": 0, "above": []}},
    }
    task, _ = enumerator(registered=False)
    task.discovery = FixedSplits(task.loop, task._on_new, [])
    task._restore(own, {0: reader0, 1: reader1})
    assert list(task.pending) == ["s4", "s3"]
    assert task.tracker.counts()[AssignmentState.UNASSIGNED.value] == 1  # s3, the enumerator's
    assert set(task.tracker.entries) == {"s3"}
    assert task.discovery.known == {"s1", "s2", "s3", "s4", "s5"}
    assert set(task.splits) == {"s3", "s4"}  # descriptions kept only for what is not held


@pytest.mark.django_db(transaction=True)
def test_a_finished_reader_holds_its_final_snapshot_as_of_later_checkpoints():
    from engine.jobs import checkpoints, reader_metadata
    from engine.jobs.submission import submit_job
    from engine.models import Checkpoint, Pipeline, TaskGroup

    job = submit_job(
        "env { job.mode = BATCH, parallelism = 2 }\nsource { FakeSource { } }\n"
        "sink { Blackhole { } }"
    )
    pipeline = Pipeline.objects.get(job=job)
    enum, first, second = TaskGroup.objects.filter(pipeline=pipeline).order_by("kind", "index")
    TaskGroup.objects.filter(pipeline=pipeline).update(status="RUNNING", attempt=1)

    def checkpoint(state: str, acks: dict) -> int:
        c = Checkpoint.objects.create(job=job, pipeline=pipeline, expected={}, state="PENDING")
        for group, held in acks.items():
            metadata = {
                "metadataVersion": 2,
                "readerAttemptLineage": [1],
                "appliedSenderWatermarks": {"1": {"upto": len(held) - 1, "above": []}},
                "recentAssignments": [[1, n, [s]] for n, s in enumerate(held)],
            }
            state_ = {"offsets": dict.fromkeys(held, 1), "big": "x" * 1000}
            snapshot = {"managed": {"state": state_, "metadata": metadata}, "sinks": []}
            assert checkpoints.acknowledge(c.id, group.id, 1, snapshot)
        Checkpoint.objects.filter(id=c.id).update(state=state)
        return c.id

    final = checkpoint("COMPLETED", {enum: [], first: ["a"], second: ["b"]})
    # The second reader FINISHED after its final checkpoint: later ones expect no ack of it.
    checkpoint("FAILED", {first: ["a", "x"], second: ["b", "y"]})
    later = checkpoint("COMPLETED", {enum: [], first: ["a", "c"]})
    states = checkpoints.acked_states(later, [first.id, second.id])
    held = {g: set(s["managed"]["state"]["offsets"]) for g, s in states.items()}
    assert held == {first.id: {"a", "c"}, second.id: {"b"}}
    assert checkpoints.acked_states(final, [second.id])[second.id] == states[second.id]
    # The completion look-up reads the same snapshots' proof keys, and nothing else.
    proofs = reader_metadata.acked_metadata(later, [first.id, second.id])
    assert proofs == {
        first.id: {
            "metadataVersion": 2,
            "readerAttemptLineage": [1],
            "appliedSenderWatermarks": {"1": {"upto": 1, "above": []}},
        },
        second.id: {
            "metadataVersion": 2,
            "readerAttemptLineage": [1],
            "appliedSenderWatermarks": {"1": {"upto": 0, "above": []}},
        },
    }
    restored = reader_metadata.acked_metadata(later, [first.id], recent=True)[first.id]
    assert restored["recentAssignments"] == [[1, 0, ["a"]], [1, 1, ["c"]]]
    assert reader_metadata.newest_completed(first.id, 1, 0) == later
    assert reader_metadata.newest_completed(second.id, 1, final) is None
