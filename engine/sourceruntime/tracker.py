"""The split assignment tracker: the coordinator keeps ownership of a split until a completed
checkpoint proves a reader has it.

States, per split id (never per subtask index): UNASSIGNED (the enumerator's), DISPATCHED (an
assignment command exists, admission not proven), ADMITTED (the target attempt accepted it),
APPLIED (the reader added it), CHECKPOINT_INCLUDED (a reader checkpoint contains it), and
GC_ELIGIBLE (that checkpoint completed globally: the entry can go). An apply acknowledgement is
flow control, not durability. A reader's failover returns every split of that reader not proven
by the checkpoint it restores from; a coordinator failover restores the tracker from the same
checkpoint as the enumerator, under a new epoch. The tracker is bounded: at its limits it
refuses new dispatches (backpressure) rather than grow.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from engine.sourceruntime.choices import AssignmentState

S = AssignmentState
TRACKER_VERSION = 1


class TrackerFull(Exception):
    """Too many (or too large) tracked assignments: the enumerator waits for a checkpoint."""


@dataclass
class Assignment:
    split_id: str
    state: AssignmentState
    reader: int | None = None  # the reader's index
    attempt: int | None = None  # the reader attempt the command targets
    command_id: str | None = None
    checkpoint: int | None = None  # the reader checkpoint that included it
    size: int = 0  # bytes of the split's description


class AssignmentTracker:
    def __init__(self, max_entries: int = 100_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: dict[str, Assignment] = {}
        self.bytes = 0
        self._commands = 0

    # -- the coordinator's transitions -------------------------------------------------------

    def dispatch(self, split_id: str, size: int, reader: int, attempt: int, epoch: int) -> str:
        """UNASSIGNED (or new) -> DISPATCHED; returns the command id to send (and to resend
        unchanged until admitted: the mailbox dedupes it)."""
        entry = self.entries.get(split_id)
        if entry is not None and entry.state != S.UNASSIGNED:
            raise ValueError(f"split {split_id} is {entry.state}, not the enumerator's")
        if entry is None:
            if len(self.entries) >= self.max_entries or self.bytes + size > self.max_bytes:
                raise TrackerFull(f"{len(self.entries)} assignments, {self.bytes} bytes")
            self.bytes += size
        self._commands += 1
        command_id = f"assign:{epoch}:{self._commands}:{split_id}"
        self.entries[split_id] = Assignment(
            split_id, S.DISPATCHED, reader, attempt, command_id, None, size
        )
        return command_id

    def admitted(self, split_id: str, attempt: int) -> bool:
        return self._advance(split_id, attempt, (S.DISPATCHED,), S.ADMITTED)

    def applied(self, split_id: str, attempt: int) -> bool:
        return self._advance(split_id, attempt, (S.DISPATCHED, S.ADMITTED), S.APPLIED)

    def included(self, reader: int, attempt: int, checkpoint: int, split_ids: set[str]) -> None:
        """A reader's checkpoint ``checkpoint`` holds these splits (its runtime metadata)."""
        for split_id in split_ids:
            entry = self.entries.get(split_id)
            if (
                entry is not None
                and entry.reader == reader
                and entry.attempt == attempt
                and entry.state in (S.DISPATCHED, S.ADMITTED, S.APPLIED)
            ):
                entry.state, entry.checkpoint = S.CHECKPOINT_INCLUDED, checkpoint

    def completed(self, checkpoint: int) -> list[str]:
        """Checkpoint ``checkpoint`` completed globally: what it included is the readers' for
        good, and leaves the tracker (GC_ELIGIBLE, then removed). Returns those split ids."""
        done = [
            e.split_id
            for e in self.entries.values()
            if e.state == S.CHECKPOINT_INCLUDED and e.checkpoint <= checkpoint
        ]
        for split_id in done:
            self.entries[split_id].state = S.GC_ELIGIBLE
            self.bytes -= self.entries.pop(split_id).size
        return done

    def aborted(self, checkpoint: int) -> None:
        """A checkpoint that will never complete proves nothing: back to APPLIED."""
        for entry in self.entries.values():
            if entry.state == S.CHECKPOINT_INCLUDED and entry.checkpoint == checkpoint:
                entry.state, entry.checkpoint = S.APPLIED, None

    def forget(self, split_id: str) -> None:
        """Nothing can prove it (checkpoints are disabled, and a restore starts over): the
        entry leaves once admitted, so the tracker does not grow with the input."""
        entry = self.entries.pop(split_id, None)
        if entry is not None:
            self.bytes -= entry.size

    def reader_failed(self, reader: int) -> list[str]:
        """The reader's attempt is gone; it restores from its last completed checkpoint, which
        holds none of the tracked splits (those are gone already). Every split tracked for it
        goes back to the enumerator; returns them in id order."""
        back = sorted(e.split_id for e in self.entries.values() if e.reader == reader)
        for split_id in back:
            entry = self.entries[split_id]
            entry.state, entry.reader, entry.attempt = S.UNASSIGNED, None, None
            entry.command_id = entry.checkpoint = None
        return back

    def reconcile(self, reader: int, held: set[str]) -> list[str]:
        """After a coordinator failover (the tracker restored from the same cut as the
        reader): what the restored reader holds is its own for good (the cut completed), the
        rest tracked for it returns to the enumerator. Returns those, in id order."""
        for split_id in [s for s in held if s in self.entries]:
            self.bytes -= self.entries.pop(split_id).size
        return self.reader_failed(reader)

    def _advance(self, split_id: str, attempt: int, sources: tuple, target: S) -> bool:
        entry = self.entries.get(split_id)
        if entry is None or entry.attempt != attempt or entry.state not in sources:
            return False  # a stale attempt's answer, or a duplicate: no effect
        entry.state = target
        return True

    # -- views and the checkpoint ----------------------------------------------------------

    def all_admitted(self) -> bool:
        """Every tracked split is past admission: a control sent now (no-more-splits) is
        ordered after all of them in the reader's mailbox."""
        return all(e.state not in (S.UNASSIGNED, S.DISPATCHED) for e in self.entries.values())

    def unassigned(self) -> list[str]:
        return sorted(e.split_id for e in self.entries.values() if e.state == S.UNASSIGNED)

    def counts(self) -> dict[str, int]:
        out = {state.value: 0 for state in S}
        for entry in self.entries.values():
            out[entry.state.value] += 1
        return out

    def to_json(self) -> str:
        """Checkpointed with the enumerator's state, in the same cut."""
        entries = [{**asdict(e), "state": e.state.value} for e in self.entries.values()]
        return json.dumps(
            {"version": TRACKER_VERSION, "commands": self._commands, "entries": entries}
        )

    @classmethod
    def from_json(cls, text: str, max_entries: int = 100_000, max_bytes: int = 64 * 1024 * 1024):
        data = json.loads(text)
        if data.get("version") != TRACKER_VERSION:
            raise ValueError(f"unknown assignment tracker version {data.get('version')!r}")
        tracker = cls(max_entries, max_bytes)
        tracker._commands = data["commands"]
        for raw in data["entries"]:
            entry = Assignment(**{**raw, "state": S(raw["state"])})
            tracker.entries[entry.split_id] = entry
            tracker.bytes += entry.size
        return tracker
