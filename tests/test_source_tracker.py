"""The split assignment tracker keeps a split the enumerator's until a completed checkpoint
proves, by a reader snapshot's runtime metadata, that a reader has it: an assignment sent by
epoch E as sequence S to attempt A is included iff the snapshot's lineage holds A and its
applied watermark for E covers S. Through duplicate delivery, lost acknowledgements, resends,
reader failover (the new attempt registers with its restored metadata), checkpoint completion
and abort, and a coordinator failover (restore from the tracker's checkpointed form), no split
is lost and none is held by two readers past a checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.sourceruntime.tracker import NOTHING, AssignmentTracker, Proof, TrackerFull

SPLITS = [f"s{i}" for i in range(8)]
READERS = (0, 1)


def metadata(lineage: list[int], **watermarks: tuple[int, list[int]]) -> dict:
    """A snapshot's runtime metadata: its lineage, and per sender (``e<epoch>``) its applied
    watermark (every sequence up to the first value, and those listed above it)."""
    return {
        "readerAttemptLineage": lineage,
        "appliedSenderWatermarks": {
            sender[1:]: {"upto": upto, "above": above}
            for sender, (upto, above) in watermarks.items()
        },
    }


def proof(lineage: list[int], **watermarks: tuple[int, list[int]]) -> Proof:
    return Proof.of(metadata(lineage, **watermarks))


def test_the_states_in_order_and_answers_of_stale_attempts_change_nothing():
    tracker = AssignmentTracker()
    command = tracker.dispatch("a", 10, reader=0, attempt=1, epoch=1, sequence=0)
    assert command.startswith("assign:1:") and tracker.counts()["DISPATCHED"] == 1
    assert not tracker.admitted("a", reader=0, attempt=0)  # a stale attempt's answer
    assert tracker.admitted("a", 0, attempt=1) and not tracker.admitted("a", 0, attempt=1)
    assert not tracker.applied("a", reader=0, attempt=0)  # a stale attempt's acknowledgement
    assert tracker.applied("a", reader=0, attempt=1)
    assert tracker.included(0, 4, proof([0], e1=(0, []))) == []  # a stale attempt's metadata
    assert tracker.included(1, 4, proof([1], e1=(0, []))) == []  # another reader's
    assert tracker.counts()["APPLIED"] == 1
    assert tracker.included(0, 5, proof([1], e1=(0, []))) == ["a"]
    assert tracker.counts()["CHECKPOINT_INCLUDED"] == 1
    tracker.aborted(5)
    assert tracker.counts()["APPLIED"] == 1
    tracker.included(0, 6, proof([1], e1=(0, [])))
    assert tracker.completed(6, {0: proof([1], e1=(0, []))}) == ["a"]
    assert tracker.entries == {} and tracker.bytes == 0
    assert tracker.reached["APPLIED"] == 1 and tracker.reached["GC_ELIGIBLE"] == 1


def test_an_acknowledgement_may_overtake_the_admission_answer():
    tracker = AssignmentTracker()
    tracker.dispatch("a", 1, 0, 1, 1, 0)
    assert tracker.applied("a", 0, 1) and not tracker.admitted("a", 0, 1)
    assert tracker.counts()["APPLIED"] == 1


def test_another_readers_answer_of_the_same_attempt_number_moves_nothing():
    """Every reader's attempts count from 1: reader 1's late answers for a split since given
    to reader 0 (attempt 1 too) leave it unadmitted, so no-more-splits cannot overtake it."""
    tracker = AssignmentTracker()
    tracker.dispatch("a", 1, reader=1, attempt=1, epoch=1, sequence=0)
    assert tracker.reader_failed(1) == ["a"]
    tracker.dispatch("a", 1, reader=0, attempt=1, epoch=1, sequence=0)
    assert not tracker.applied("a", reader=1, attempt=1)
    assert not tracker.admitted("a", reader=1, attempt=1)
    assert tracker.entries["a"].state.value == "DISPATCHED" and not tracker.all_admitted()
    assert tracker.admitted("a", reader=0, attempt=1) and tracker.all_admitted()


def test_a_report_reaches_only_its_readers_entries_through_the_index():
    """The reader index follows every transition: dispatch, return, completion, forget and
    the checkpointed form; a report costs its reader's entries, not the tracker's."""
    tracker = AssignmentTracker()
    for n in range(50):
        tracker.dispatch(f"r1-{n}", 1, reader=1, attempt=1, epoch=1, sequence=n)
    tracker.dispatch("a", 1, reader=0, attempt=1, epoch=1, sequence=0)
    tracker.dispatch("b", 1, reader=0, attempt=1, epoch=1, sequence=1)
    assert tracker._by_reader[0].keys() == {"a", "b"} and len(tracker._by_reader[1]) == 50
    tracker.forget("b")
    assert tracker.reconcile(0, NOTHING) == ["a"] and 0 not in tracker._by_reader
    tracker.dispatch("a", 1, reader=1, attempt=1, epoch=1, sequence=50)
    assert "a" in tracker._by_reader[1]
    copy = AssignmentTracker.from_json(tracker.to_json())
    assert {r: set(e) for r, e in copy._by_reader.items()} == {1: set(tracker.entries)}
    assert tracker.included(0, 3, proof([1], e1=(60, []))) == []  # reader 0 holds nothing
    assert len(tracker.included(1, 3, proof([1], e1=(60, [])))) == 51
    assert tracker.completed(3, {1: proof([1], e1=(60, []))})
    assert tracker.entries == {} and tracker._by_reader == {}


def test_a_stale_attempts_metadata_never_includes_even_with_the_sequence_applied():
    """Attempt 2 is the target; attempt 1 (an older one) applied the same sender's sequences
    up to 9, and attempt 3 (a newer one) was not restored from attempt 2: neither proves."""
    tracker = AssignmentTracker()
    tracker.dispatch("a", 1, 0, attempt=2, epoch=1, sequence=3)
    for stale in (proof([1], e1=(9, [])), proof([1, 3], e1=(9, [])), NOTHING):
        assert tracker.included(0, 7, stale) == []
        assert tracker.completed(7, {0: stale}) == []
    assert tracker.counts()["DISPATCHED"] == 1
    # A newer attempt restored from attempt 2's checkpoint has it in its lineage: it proves.
    assert tracker.completed(8, {0: proof([1, 2, 3], e1=(3, []))}) == ["a"]


def test_a_sequence_in_a_gap_or_of_another_sender_is_not_included():
    tracker = AssignmentTracker()
    for n, split in enumerate(("a", "b", "c", "d")):
        tracker.dispatch(split, 1, 0, 1, 1, n)
    tracker.dispatch("x", 1, 0, 1, 2, 0)  # another epoch's sequence 0
    # Applied: 0 and 1, then a gap (2), then 3; nothing of epoch 2.
    included = tracker.included(0, 5, proof([1], e1=(1, [3])))
    assert included == ["a", "b", "d"]
    assert {s for s, e in tracker.entries.items() if e.state.value == "DISPATCHED"} == {"c", "x"}


def test_a_completion_settles_every_inclusion_by_its_own_readers_metadata():
    """An inclusion by a checkpoint whose abort was lost is taken back when a later one
    completes without proving it; what the completed one proves leaves, whatever its state."""
    tracker = AssignmentTracker()
    tracker.dispatch("a", 1, 0, 1, 1, 0)
    tracker.dispatch("b", 1, 0, 1, 1, 1)
    tracker.included(0, 4, proof([1], e1=(1, [])))  # a report from a snapshot that failed
    assert tracker.completed(5, {0: proof([1], e1=(0, []))}) == ["a"]
    assert tracker.counts()["APPLIED"] == 1 and set(tracker.entries) == {"b"}
    assert tracker.completed(6, {}) == []  # a reader without metadata proves nothing


def test_a_registering_attempt_keeps_what_its_metadata_proves_and_returns_the_rest():
    tracker = AssignmentTracker()
    for n, split in enumerate(("a", "b", "c")):
        tracker.dispatch(split, 1, 0, 1, 1, n)
    tracker.dispatch("z", 1, 1, 1, 1, 0)  # reader 1's: untouched
    restored = proof([1, 2], e1=(0, [2]))  # attempt 2, from a checkpoint of attempt 1
    assert tracker.reconcile(0, restored, attempt=2) == ["b"]
    assert set(tracker.entries) == {"b", "z"} and tracker.unassigned() == ["b"]
    tracker.dispatch("b", 1, 0, 2, 1, 3)
    assert tracker.reconcile(0, restored, attempt=2) == []  # repeated: its own stay
    assert tracker.entries["b"].state.value == "DISPATCHED"
    assert tracker.reader_failed(1) == ["z"]


def test_the_next_sequence_goes_on_above_everything_applied():
    assert NOTHING.next_sequence(4) == 0
    assert proof([1], e4=(6, [])).next_sequence(4) == 7
    assert proof([1], e4=(2, [5, 9])).next_sequence(4) == 10
    assert proof([1], e4=(2, [])).next_sequence(5) == 0


def test_a_full_tracker_pushes_back():
    tracker = AssignmentTracker(max_entries=2, max_bytes=100)
    tracker.dispatch("a", 10, 0, 1, 1, 0)
    tracker.dispatch("b", 10, 0, 1, 1, 1)
    with pytest.raises(TrackerFull):
        tracker.dispatch("c", 10, 0, 1, 1, 2)
    with pytest.raises(TrackerFull):
        AssignmentTracker(max_bytes=5).dispatch("big", 6, 0, 1, 1, 0)


def test_the_checkpointed_form_round_trips_and_refuses_another_version():
    tracker = AssignmentTracker()
    tracker.dispatch("a", 3, 1, 2, 4, 7)
    copy = AssignmentTracker.from_json(tracker.to_json())
    assert copy.entries == tracker.entries and copy.bytes == 3
    assert copy.entries["a"].sender == 4 and copy.entries["a"].sequence == 7
    for version in (1, 99):  # 1: entries nothing could prove (no sender, no sequence)
        with pytest.raises(ValueError, match="unknown assignment tracker version"):
            AssignmentTracker.from_json(f'{{"version": {version}}}')


def watermarks(applied: set[tuple[int, int]]) -> dict:
    """Applied (sender, sequence) pairs as a snapshot records them."""
    out = {}
    for sender in {s for s, _ in applied}:
        sequences = {q for s, q in applied if s == sender}
        upto = -1
        while upto + 1 in sequences:
            upto += 1
        out[str(sender)] = {"upto": upto, "above": sorted(q for q in sequences if q > upto)}
    return out


class Assignments(RuleBasedStateMachine):
    """Readers hold splits; commands travel over a lossy, duplicating channel; what a reader
    applied is what its snapshots' metadata says, and nothing else proves anything."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = AssignmentTracker()
        self.epoch = 1
        self.attempt = {r: 1 for r in READERS}
        self.lineage = {r: [1] for r in READERS}
        self.sequence = {r: -1 for r in READERS}  # the coordinator's last, per reader
        self.held = {r: set() for r in READERS}  # live reader state
        self.applied = {r: set() for r in READERS}  # (sender, sequence) applied, this lineage
        self.durable = {r: set() for r in READERS}  # as of the last completed checkpoint
        self.durable_metadata = {r: None for r in READERS}
        self.channel: list[tuple[str, int, int, int, int, str]] = []
        self.checkpoint = 0
        self.saved = self.tracker.to_json()  # the enumerator's checkpointed tracker
        self.pending: dict | None = None  # a checkpoint's snapshots, not completed yet
        self.old_snapshots: list = []
        self.ever: set[str] = set()  # splits the enumerator dispatched
        self.saved_ever: set[str] = set()  # the same, as of its checkpoint

    def snapshot_of(self, reader: int) -> dict:
        return {
            "readerAttemptLineage": list(self.lineage[reader]),
            "appliedSenderWatermarks": watermarks(self.applied[reader]),
        }

    @rule(split=st.sampled_from(SPLITS), reader=st.sampled_from(READERS))
    def assign(self, split, reader):
        entry = self.tracker.entries.get(split)
        owned = any(split in d for d in self.durable.values())
        if owned or (entry is not None and entry.state.value != "UNASSIGNED"):
            return
        self.sequence[reader] += 1
        sequence, attempt = self.sequence[reader], self.attempt[reader]
        command = self.tracker.dispatch(split, 1, reader, attempt, self.epoch, sequence)
        self.ever.add(split)
        self.channel.append((split, reader, attempt, self.epoch, sequence, command))

    @precondition(lambda self: self.channel)
    @rule(data=st.data(), keep=st.booleans(), ack=st.booleans())
    def deliver(self, data, keep, ack):
        """Delivered (kept: it will be delivered again), acknowledged or not."""
        i = data.draw(st.integers(0, len(self.channel) - 1))
        split, reader, attempt, sender, sequence, _ = self.channel[i]
        if not keep:
            self.channel.pop(i)
        if attempt != self.attempt[reader] or (sender, sequence) in self.applied[reader]:
            return  # STALE_TARGET, or DUPLICATE (its applied watermark): no second effect
        self.applied[reader].add((sender, sequence))
        self.held[reader].add(split)
        if ack:
            self.tracker.admitted(split, reader, attempt)
            self.tracker.applied(split, reader, attempt)

    @rule()
    def resend(self):
        for e in self.tracker.entries.values():
            if e.state.value == "DISPATCHED":
                self.channel.append(
                    (e.split_id, e.reader, e.attempt, e.sender, e.sequence, e.command_id)
                )

    @precondition(lambda self: self.pending is None)
    @rule()
    def snapshot(self):
        """Every reader snapshots (state and metadata); the checkpoint completes or aborts
        later, with deliveries in between; each snapshot's report includes what it proves."""
        self.checkpoint += 1
        self.pending = {
            r: (self.attempt[r], set(self.held[r]), self.snapshot_of(r)) for r in READERS
        }
        self.old_snapshots.append((self.checkpoint, dict(self.pending)))
        for r, (_, _, snapshot) in self.pending.items():
            self.tracker.included(r, self.checkpoint, Proof.of(snapshot))

    @precondition(lambda self: self.pending is not None)
    @rule(complete=st.booleans())
    def finish_checkpoint(self, complete):
        pending, self.pending = self.pending, None
        if complete and all(a == self.attempt[r] for r, (a, _, _) in pending.items()):
            for r, (_, held, snapshot) in pending.items():
                self.durable[r], self.durable_metadata[r] = set(held), snapshot
            proofs = {r: Proof.of(snapshot) for r, (_, _, snapshot) in pending.items()}
            self.tracker.completed(self.checkpoint, proofs)
            self.saved, self.saved_ever = self.tracker.to_json(), set(self.ever)
        else:  # aborted (a reader failed in between: it can never complete)
            self.tracker.aborted(self.checkpoint)

    @precondition(lambda self: self.old_snapshots)
    @rule(data=st.data())
    def late_metadata(self, data):
        """An older checkpoint's report arrives again, late: an inclusion at most, which the
        next completion settles."""
        checkpoint, snapshot = data.draw(st.sampled_from(self.old_snapshots))
        for r, (_, _, metadata) in snapshot.items():
            self.tracker.included(r, checkpoint, Proof.of(metadata))

    def restart(self, reader: int) -> None:
        """A new attempt of ``reader`` restores its last completed snapshot and registers."""
        self.attempt[reader] += 1
        restored = self.durable_metadata[reader]
        self.lineage[reader] = [
            *(restored or {}).get("readerAttemptLineage", []),
            self.attempt[reader],
        ]
        self.held[reader] = set(self.durable[reader])
        self.applied[reader] = {
            (int(sender), q)
            for sender, w in ((restored or {}).get("appliedSenderWatermarks") or {}).items()
            for q in [*range(w["upto"] + 1), *w["above"]]
        }
        proof = Proof.of(restored)
        self.tracker.reconcile(reader, proof, self.attempt[reader])
        # Its sequences go on above what it applied; the gaps below are settled (REGISTER).
        start = proof.next_sequence(self.epoch)
        self.applied[reader] |= {(self.epoch, q) for q in range(start)}
        self.sequence[reader] = start - 1

    @rule(reader=st.sampled_from(READERS))
    def reader_fails(self, reader):
        self.restart(reader)

    @rule()
    def coordinator_fails(self):
        """The pipeline restores from its last completed checkpoint: the tracker from its
        checkpointed form, every reader from its own, a new epoch."""
        self.epoch += 1
        self.tracker = AssignmentTracker.from_json(self.saved)
        self.ever = set(self.saved_ever)  # the enumerator's own state, from the same cut
        for r in READERS:
            self.restart(r)

    @invariant()
    def the_reader_index_matches_the_entries(self):
        index = {r: set(held) for r, held in self.tracker._by_reader.items()}
        expected: dict[int, set[str]] = {}
        for entry in self.tracker.entries.values():
            if entry.reader is not None:
                expected.setdefault(entry.reader, set()).add(entry.split_id)
        assert index == expected

    @invariant()
    def no_split_lost_or_held_twice(self):
        for split in SPLITS:
            durable = [r for r in READERS if split in self.durable[r]]
            entry = self.tracker.entries.get(split)
            assert len(durable) <= 1, f"{split} is in two readers' checkpoints"
            assert not (durable and entry), f"{split} is both checkpointed and tracked"
            if split in self.ever:  # dispatched once: the enumerator's or a checkpoint's
                assert durable or entry, f"{split} is lost"
            if entry is not None and entry.state.value != "UNASSIGNED":
                # Tracked for a reader: its current attempt, or the split is stranded.
                assert entry.attempt == self.attempt[entry.reader], f"{split} is stranded"
            for r in READERS:
                if split in self.held[r] and split not in self.durable[r]:
                    assert entry is not None and entry.reader == r, f"{split} held, untracked"


TestAssignments = Assignments.TestCase
TestAssignments.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
