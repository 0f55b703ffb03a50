"""What a managed reader's snapshots keep so that its enumerator can prove ownership, and how
all of it stays bounded: recent assignments until a checkpoint that held them completed, the
snapshot ids whose callback may still come, the lineage, the applied watermarks (older senders
dropped, gaps bounded, settled by a registration), and LocalFile's state (its unfinished files
only). In process, on the real event loop and mailbox."""

from __future__ import annotations

from engine.connectors.localfile_managed import ManagedLocalFileReader
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.ownership import LINEAGE_MAX, lineage_of, recent_split_ids
from engine.sourceruntime.reader import ReaderEventLoop
from engine.states import JobMode
from tests.source_conformance import read_all
from tests.test_source_conformance_localfile import source_in, write
from tests.test_source_reader_loop import CountingReader, drain, loop, send


def barrier(event_loop, box, snaps, checkpoint: int) -> dict:
    send(box, CommandKind.CHECKPOINT, {"checkpoint": checkpoint})
    drain(event_loop)
    return snaps[-1].metadata


def test_an_assignment_stays_in_the_metadata_until_a_checkpoint_that_held_it_completed():
    event_loop, box, _, _, snaps = loop()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    assert recent_split_ids(barrier(event_loop, box, snaps, 1)) == {"a"}
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["b"]})
    assert recent_split_ids(barrier(event_loop, box, snaps, 2)) == {"a", "b"}
    send(box, CommandKind.CHECKPOINT_COMPLETE, {"checkpoint": 1})  # held a, not b
    metadata = barrier(event_loop, box, snaps, 3)
    assert metadata["recentAssignments"] == [[1, 2, ["b"]]]  # (sender, sequence, splits)
    event_loop.checkpoint_completed(3)  # as the task group's commits found it
    assert recent_split_ids(barrier(event_loop, box, snaps, 4)) == set()
    assert event_loop.snapshots == [4]  # callbacks may still come for this one only


def test_a_restored_assignment_stays_until_this_attempt_completes_a_checkpoint_holding_it():
    event_loop, box, _, _, snaps = loop()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    barrier(event_loop, box, snaps, 1)
    fresh = ReaderMailbox(1, "1/1", 3, MailboxLimits(), WorkerBudget(10**9))
    again = ReaderEventLoop(
        fresh, CountingReader(), PollLimits(), list.append, snaps.append, "digest", [2]
    )
    again.start(snaps[-1])
    fresh.sent = 10  # the sender's sequences go on
    again.checkpoint_completed(1)  # the checkpoint restored from: not this attempt's
    assert recent_split_ids(again.metadata()) == {"a"}
    send(fresh, CommandKind.CHECKPOINT, {"checkpoint": 2}, attempt=3)
    drain(again)
    again.checkpoint_completed(2)
    assert recent_split_ids(again.metadata()) == set() and again.snapshots == []


def test_snapshot_ids_are_kept_only_while_their_callback_may_come():
    event_loop, box, _, _, _ = loop()
    for checkpoint in range(1, 50):
        send(box, CommandKind.CHECKPOINT, {"checkpoint": checkpoint})
        verdict = (
            CommandKind.CHECKPOINT_ABORT if checkpoint % 3 else CommandKind.CHECKPOINT_COMPLETE
        )
        send(box, verdict, {"checkpoint": checkpoint})
        drain(event_loop)
        assert event_loop.snapshots == []
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 50})
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 51})
    send(box, CommandKind.CHECKPOINT_COMPLETE, {"checkpoint": 51})  # commits 50 as well
    drain(event_loop)
    assert event_loop.snapshots == [] and event_loop.metrics.stale_callbacks == 0


def test_without_checkpoints_no_assignment_is_recorded():
    box = ReaderMailbox(1, "1/1", 2, MailboxLimits(), WorkerBudget(10**9))
    out = []
    event_loop = ReaderEventLoop(
        box, CountingReader(), PollLimits(), out.extend, out.append, "d", checkpointing=False
    )
    event_loop.start()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    drain(event_loop)
    assert len(event_loop.recent) == 0


def test_the_lineage_keeps_the_newest_attempts():
    assert lineage_of(None, 4) == [4]
    assert lineage_of(list(range(1, 20)), 20) == list(range(21 - LINEAGE_MAX, 21))


def envelope(sender: int, sequence: int, kind=CommandKind.ASSIGN_SPLITS) -> SourceCommandEnvelope:
    return SourceCommandEnvelope.build(
        job_id=1,
        source_runtime_id="1/1",
        epoch=sender,
        sender_attempt=sender,
        target_attempt=2,
        sequence=sequence,
        command_id=f"{kind}:{sender}:{sequence}",
        kind=kind,
        payload=b'{"splits": []}' if kind == CommandKind.ASSIGN_SPLITS else b"",
    )


def apply(box: ReaderMailbox, env: SourceCommandEnvelope) -> AdmissionStatus:
    status = box.admit(env).status
    if status == AdmissionStatus.ACCEPTED:
        box.applied(box.take().envelope)
    return status


def test_a_newer_senders_command_drops_the_older_senders_watermarks():
    box = ReaderMailbox(1, "1/1", 2, MailboxLimits(), WorkerBudget(10**9))
    apply(box, envelope(3, 0))
    apply(box, envelope(4, 0, CommandKind.REGISTER))
    assert box.watermarks() == {"4": {"upto": 0, "above": []}}
    assert apply(box, envelope(3, 1)) == AdmissionStatus.STALE_TARGET  # its epoch is fenced


def test_the_gaps_are_bounded_and_a_registration_settles_them():
    box = ReaderMailbox(
        1, "1/1", 2, MailboxLimits(max_commands=4, reserved_commands=1), WorkerBudget(10**9)
    )
    for sequence in (0, 2, 3, 4, 5):  # 1 never came: four past the gap
        assert apply(box, envelope(1, sequence)) == AdmissionStatus.ACCEPTED
    refused = box.admit(envelope(1, 6))
    assert (refused.status, refused.reasonCode) == (AdmissionStatus.RETRY_LATER, "SEQUENCE_GAPS")
    assert apply(box, envelope(1, 1)) == AdmissionStatus.ACCEPTED  # the one that fills
    assert box.watermarks() == {"1": {"upto": 5, "above": []}}
    for sequence in (7, 8, 9, 10):
        apply(box, envelope(1, sequence))
    # A registration of this attempt (its sender reconciled it) settles what lies below it.
    assert apply(box, envelope(1, 11, CommandKind.REGISTER)) == AdmissionStatus.ACCEPTED
    assert box.watermarks() == {"1": {"upto": 11, "above": []}}


def test_a_localfile_readers_state_holds_its_unfinished_files_only(tmp_path):
    for n in range(200):
        write(tmp_path, f"f{n:03d}.csv", n * 30)
    source = source_in(tmp_path, fields="id = int")
    reader = ManagedLocalFileReader(source, JobMode.STREAMING)
    reader.add_splits(source.create_splits(JobMode.STREAMING))
    assert len(reader.snapshot()["splits"]) == 200
    rows = read_all(reader)
    assert len(rows) == 200 * 30
    assert reader.snapshot() == {"splits": [], "offsets": {}}
    assert reader.splits == {} and reader._reading == {}


def test_a_localfile_state_of_version_1_is_read_without_its_finished_files(tmp_path):
    write(tmp_path, "a.csv", 0)
    write(tmp_path, "b.csv", 30)
    source = source_in(tmp_path, fields="id = int")
    a, b = sorted(source.create_splits(JobMode.BATCH), key=lambda s: s["path"])
    old = {
        "splits": [a, b],
        "offsets": {a["splitId"]: 30, b["splitId"]: 10},
        "done": [a["splitId"]],
    }
    reader = ManagedLocalFileReader(source, JobMode.BATCH)
    reader.restore(old)
    reader.notify_no_more_splits()
    assert set(reader.splits) == {b["splitId"]}
    assert sorted(r[0] for r in read_all(reader)) == list(range(40, 60))
