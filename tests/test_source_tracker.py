"""The split assignment tracker keeps a split the enumerator's until a completed checkpoint
proves a reader has it: through duplicate delivery, lost acknowledgements, resends, reader
failover, checkpoint completion and abort, and a coordinator failover (restore from the
tracker's checkpointed form). No split is lost, none is held by two readers past a checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.sourceruntime.tracker import AssignmentTracker, TrackerFull

SPLITS = [f"s{i}" for i in range(8)]
READERS = (0, 1)


def test_the_states_in_order_and_answers_of_stale_attempts_change_nothing():
    tracker = AssignmentTracker()
    command = tracker.dispatch("a", 10, reader=0, attempt=1, epoch=1)
    assert command.startswith("assign:1:") and tracker.counts()["DISPATCHED"] == 1
    assert not tracker.admitted("a", attempt=0)  # a stale attempt's answer
    assert tracker.admitted("a", attempt=1) and not tracker.admitted("a", attempt=1)
    assert tracker.applied("a", attempt=1)
    tracker.included(0, 0, checkpoint=4, split_ids={"a"})  # an older attempt's metadata
    tracker.included(1, 1, checkpoint=4, split_ids={"a"})  # another reader's
    assert tracker.counts()["APPLIED"] == 1
    tracker.included(0, 1, checkpoint=5, split_ids={"a"})
    assert tracker.counts()["CHECKPOINT_INCLUDED"] == 1
    tracker.aborted(5)
    assert tracker.counts()["APPLIED"] == 1
    tracker.included(0, 1, checkpoint=6, split_ids={"a"})
    assert tracker.completed(5) == [] and tracker.completed(6) == ["a"]
    assert tracker.entries == {} and tracker.bytes == 0


def test_a_full_tracker_pushes_back():
    tracker = AssignmentTracker(max_entries=2, max_bytes=100)
    tracker.dispatch("a", 10, 0, 1, 1)
    tracker.dispatch("b", 10, 0, 1, 1)
    with pytest.raises(TrackerFull):
        tracker.dispatch("c", 10, 0, 1, 1)
    with pytest.raises(TrackerFull):
        AssignmentTracker(max_bytes=5).dispatch("big", 6, 0, 1, 1)


def test_the_checkpointed_form_round_trips_and_refuses_an_unknown_version():
    tracker = AssignmentTracker()
    tracker.dispatch("a", 3, 1, 2, 4)
    copy = AssignmentTracker.from_json(tracker.to_json())
    assert copy.entries == tracker.entries and copy.bytes == 3
    with pytest.raises(ValueError, match="unknown assignment tracker version"):
        AssignmentTracker.from_json('{"version": 99}')


class Assignments(RuleBasedStateMachine):
    """Readers hold splits; commands travel over a lossy, duplicating channel."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = AssignmentTracker()
        self.epoch = 1
        self.attempt = {r: 1 for r in READERS}
        self.held = {r: set() for r in READERS}  # live reader state
        self.durable = {r: set() for r in READERS}  # as of the last completed checkpoint
        self.seen = {r: set() for r in READERS}  # command ids applied by the current attempt
        self.channel: list[tuple[str, int, int, str]] = []
        self.checkpoint = 0
        self.saved = self.tracker.to_json()  # the enumerator's checkpointed tracker
        self.pending: dict | None = None  # a checkpoint's snapshots, not completed yet
        self.old_snapshots: list = []
        self.ever: set[str] = set()  # splits the enumerator dispatched
        self.saved_ever: set[str] = set()  # the same, as of its checkpoint

    @rule(split=st.sampled_from(SPLITS), reader=st.sampled_from(READERS))
    def assign(self, split, reader):
        entry = self.tracker.entries.get(split)
        owned = any(split in d for d in self.durable.values())
        if owned or (entry is not None and entry.state.value != "UNASSIGNED"):
            return
        command = self.tracker.dispatch(split, 1, reader, self.attempt[reader], self.epoch)
        self.ever.add(split)
        self.channel.append((split, reader, self.attempt[reader], command))

    @precondition(lambda self: self.channel)
    @rule(data=st.data(), keep=st.booleans(), ack=st.booleans())
    def deliver(self, data, keep, ack):
        """Delivered (kept: it will be delivered again), acknowledged or not."""
        i = data.draw(st.integers(0, len(self.channel) - 1))
        split, reader, attempt, command = self.channel[i]
        if not keep:
            self.channel.pop(i)
        if attempt != self.attempt[reader] or command in self.seen[reader]:
            return  # STALE_TARGET, or DUPLICATE: no second effect
        self.seen[reader].add(command)
        self.held[reader].add(split)
        if ack:
            self.tracker.admitted(split, attempt)
            self.tracker.applied(split, attempt)

    @rule()
    def resend(self):
        for entry in self.tracker.entries.values():
            if entry.state.value == "DISPATCHED":
                self.channel.append((entry.split_id, entry.reader, entry.attempt, entry.command_id))

    @precondition(lambda self: self.pending is None)
    @rule()
    def snapshot(self):
        """Every reader snapshots (its runtime metadata names its splits); the checkpoint
        completes or aborts later, with deliveries in between."""
        self.checkpoint += 1
        self.pending = {r: (self.attempt[r], set(self.held[r])) for r in READERS}
        self.old_snapshots.append((self.checkpoint, dict(self.pending)))
        for r, (attempt, held) in self.pending.items():
            self.tracker.included(r, attempt, self.checkpoint, held)

    @precondition(lambda self: self.pending is not None)
    @rule(complete=st.booleans())
    def finish_checkpoint(self, complete):
        pending, self.pending = self.pending, None
        if complete and all(a == self.attempt[r] for r, (a, _) in pending.items()):
            for r, (_, held) in pending.items():
                self.durable[r] = set(held)
            self.tracker.completed(self.checkpoint)
            self.saved, self.saved_ever = self.tracker.to_json(), set(self.ever)
        else:  # aborted (a reader failed in between: it can never complete)
            self.tracker.aborted(self.checkpoint)

    @precondition(lambda self: self.old_snapshots)
    @rule(data=st.data())
    def late_metadata(self, data):
        """An older attempt's checkpoint metadata arrives again, late: no effect."""
        checkpoint, snapshot = data.draw(st.sampled_from(self.old_snapshots))
        for r, (attempt, held) in snapshot.items():
            if attempt != self.attempt[r]:
                self.tracker.included(r, attempt, checkpoint, held)

    @rule(reader=st.sampled_from(READERS))
    def reader_fails(self, reader):
        self.attempt[reader] += 1
        self.held[reader] = set(self.durable[reader])
        self.seen[reader] = set()
        self.tracker.reader_failed(reader)

    @rule()
    def coordinator_fails(self):
        """The pipeline restores from its last completed checkpoint: the tracker from its
        checkpointed form, every reader from its own, a new epoch."""
        self.epoch += 1
        self.tracker = AssignmentTracker.from_json(self.saved)
        self.ever = set(self.saved_ever)  # the enumerator's own state, from the same cut
        for r in READERS:
            self.attempt[r] += 1
            self.held[r] = set(self.durable[r])
            self.seen[r] = set()
            self.tracker.reader_failed(r)

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
