"""The split assignment tracker: the coordinator keeps ownership of a split until a completed
checkpoint proves a reader has it.

States, per split id (never per subtask index): UNASSIGNED (the enumerator's), DISPATCHED (an
assignment command exists, admission not proven), ADMITTED (the target attempt accepted it),
APPLIED (the reader added it: its assignment acknowledgement, flow control and not durability),
CHECKPOINT_INCLUDED (a reader checkpoint's runtime metadata proves it), and GC_ELIGIBLE (a
checkpoint proving it completed globally: the entry can go).

Inclusion is proven by runtime metadata, never by what a connector's state happens to hold: an
assignment sent by coordinator epoch E with sender sequence S to reader attempt A is included
by a reader snapshot iff the snapshot's attempt lineage contains A and its applied watermark
for sender E covers S (S at or below the watermark, or above it but not in a gap). A stale
attempt's metadata has no lineage of the current attempt, so it never includes. Answers are
fenced by reader and attempt together: attempt numbers repeat across readers (each starts at
1), so a late acknowledgement from another reader's attempt of the same number moves nothing.
Entries are indexed by reader, so a snapshot report costs that reader's entries only. A reader
attempt that registers (restored from a completed checkpoint) keeps what its restored metadata
proves and returns the rest of its splits to the enumerator; a coordinator failover restores
the tracker from the same checkpoint as the enumerator, under a new epoch. The tracker is
bounded: at its limits it refuses new dispatches (backpressure) rather than grow.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass

from engine.sourceruntime.choices import AssignmentState

S = AssignmentState
#: 2: entries name the sender (coordinator epoch) and sender sequence of their command.
TRACKER_VERSION = 2
#: States in which an assignment may be proven by a reader's metadata.
UNPROVEN = (S.DISPATCHED, S.ADMITTED, S.APPLIED)


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
    sender: int | None = None  # the coordinator epoch that sent its command
    sequence: int | None = None  # its sender sequence to that reader


@dataclass(frozen=True)
class Proof:
    """What one reader snapshot's runtime metadata proves: the reader attempts of its lineage,
    and per sender (coordinator epoch) the sequences it applied: every one up to ``upto``, and
    those in ``above`` (past a gap: the sequences between were never applied)."""

    lineage: frozenset[int]
    applied: dict[int, tuple[int, frozenset[int]]]

    @classmethod
    def of(cls, metadata: dict | None) -> Proof:
        """From a snapshot's runtime metadata (``readerAttemptLineage`` and
        ``appliedSenderWatermarks``); None or an empty one proves nothing."""
        metadata = metadata or {}
        lineage = frozenset(int(a) for a in metadata.get("readerAttemptLineage") or ())
        applied = {
            int(sender): (int(w["upto"]), frozenset(int(s) for s in w.get("above") or ()))
            for sender, w in (metadata.get("appliedSenderWatermarks") or {}).items()
        }
        return cls(lineage, applied)

    def covers(self, attempt: int | None, sender: int | None, sequence: int | None) -> bool:
        if attempt not in self.lineage or sender is None or sequence is None:
            return False
        watermark = self.applied.get(sender)
        return watermark is not None and (sequence <= watermark[0] or sequence in watermark[1])

    def next_sequence(self, sender: int) -> int:
        """The first sequence of ``sender`` above everything this proof has applied."""
        upto, above = self.applied.get(sender, (-1, frozenset()))
        return max(upto, *above) + 1 if above else upto + 1


NOTHING = Proof(frozenset(), {})


class AssignmentTracker:
    def __init__(self, max_entries: int = 100_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: dict[str, Assignment] = {}
        #: The entries tracked for each reader (kept in step with every transition that sets
        #: or clears an entry's reader), so one reader's report never scans the others'.
        self._by_reader: dict[int, dict[str, Assignment]] = {}
        self.bytes = 0
        self._commands = 0
        #: Transitions into each state since this tracker started (a metric: not checkpointed).
        self.reached: Counter[str] = Counter()

    # -- the coordinator's transitions -------------------------------------------------------

    def dispatch(
        self, split_id: str, size: int, reader: int, attempt: int, epoch: int, sequence: int
    ) -> str:
        """UNASSIGNED (or new) -> DISPATCHED, sent by ``epoch`` as its ``sequence`` to that
        reader; returns the command id to send (and to resend unchanged, under the same
        sequence, until admitted: the mailbox dedupes it)."""
        entry = self.entries.get(split_id)
        if entry is not None and entry.state != S.UNASSIGNED:
            raise ValueError(f"split {split_id} is {entry.state}, not the enumerator's")
        if entry is None:
            if len(self.entries) >= self.max_entries or self.bytes + size > self.max_bytes:
                raise TrackerFull(f"{len(self.entries)} assignments, {self.bytes} bytes")
            self.bytes += size
        self._commands += 1
        self.reached[S.DISPATCHED.value] += 1
        command_id = f"assign:{epoch}:{self._commands}:{split_id}"
        self._place(
            Assignment(
                split_id, S.DISPATCHED, reader, attempt, command_id, None, size, epoch, sequence
            )
        )
        return command_id

    def admitted(self, split_id: str, reader: int, attempt: int) -> bool:
        return self._advance(split_id, reader, attempt, (S.DISPATCHED,), S.ADMITTED)

    def applied(self, split_id: str, reader: int, attempt: int) -> bool:
        """Attempt ``attempt`` of reader ``reader`` acknowledged applying it (an
        acknowledgement may overtake the admission answer: DISPATCHED moves too)."""
        return self._advance(split_id, reader, attempt, (S.DISPATCHED, S.ADMITTED), S.APPLIED)

    def included(self, reader: int, checkpoint: int, proof: Proof) -> list[str]:
        """Reader ``reader``'s snapshot for checkpoint ``checkpoint`` (acknowledged, not known
        to be completed) has runtime metadata ``proof``: what it proves is CHECKPOINT_INCLUDED
        until that checkpoint completes or aborts. Returns those split ids."""
        out = []
        for entry in self._by_reader.get(reader, {}).values():
            if entry.state in UNPROVEN and proof.covers(
                entry.attempt, entry.sender, entry.sequence
            ):
                entry.state, entry.checkpoint = S.CHECKPOINT_INCLUDED, checkpoint
                out.append(entry.split_id)
        self.reached[S.CHECKPOINT_INCLUDED.value] += len(out)
        return out

    def completed(self, checkpoint: int, proofs: dict[int, Proof]) -> list[str]:
        """Checkpoint ``checkpoint`` completed globally; ``proofs`` are its readers' snapshots'
        metadata, by reader index. What they prove is the readers' for good: GC_ELIGIBLE, and
        the entry leaves. An entry included by an earlier checkpoint that this one does not
        prove was included by one that never completed (its abort was lost): APPLIED again.
        Returns the split ids that left, in id order."""
        done = []
        for entry in self.entries.values():
            if entry.reader is None or entry.state == S.UNASSIGNED:
                continue
            proof = proofs.get(entry.reader, NOTHING)
            if proof.covers(entry.attempt, entry.sender, entry.sequence):
                entry.state = S.GC_ELIGIBLE
                done.append(entry.split_id)
            elif entry.state == S.CHECKPOINT_INCLUDED and entry.checkpoint <= checkpoint:
                entry.state, entry.checkpoint = S.APPLIED, None
        for split_id in done:
            self._remove(split_id)
        self.reached[S.GC_ELIGIBLE.value] += len(done)
        return sorted(done)

    def aborted(self, checkpoint: int) -> None:
        """A checkpoint that will never complete proves nothing: back to APPLIED."""
        for entry in self.entries.values():
            if entry.state == S.CHECKPOINT_INCLUDED and entry.checkpoint == checkpoint:
                entry.state, entry.checkpoint = S.APPLIED, None

    def forget(self, split_id: str) -> None:
        """Nothing can prove it (checkpoints are disabled, and a restore starts over): the
        entry leaves once admitted, so the tracker does not grow with the input."""
        if split_id in self.entries:
            self._remove(split_id)

    def reader_failed(self, reader: int) -> list[str]:
        """The reader's attempt is gone and nothing proves what it had: every split tracked for
        it goes back to the enumerator; returns them in id order."""
        return self.reconcile(reader, NOTHING)

    def reconcile(self, reader: int, proof: Proof, attempt: int | None = None) -> list[str]:
        """Reader ``reader`` registers as ``attempt``, restored from a completed checkpoint
        whose snapshot's runtime metadata is ``proof``: what that proves is the reader's for
        good (the entry leaves), the rest tracked for it (but for ``attempt``'s own
        assignments: a registration repeated) returns to the enumerator. Returns those split
        ids, in id order."""
        back = []
        for entry in list(self._by_reader.get(reader, {}).values()):
            if attempt is not None and entry.attempt == attempt:
                continue
            if proof.covers(entry.attempt, entry.sender, entry.sequence):
                self._remove(entry.split_id)
                continue
            self._unindex(entry)
            entry.state, entry.reader, entry.attempt = S.UNASSIGNED, None, None
            entry.command_id = entry.checkpoint = entry.sender = entry.sequence = None
            back.append(entry.split_id)
        self.reached[S.UNASSIGNED.value] += len(back)
        return sorted(back)

    def _advance(self, split_id: str, reader: int, attempt: int, sources: tuple, target: S) -> bool:
        entry = self.entries.get(split_id)
        if (
            entry is None
            or entry.reader != reader
            or entry.attempt != attempt
            or entry.state not in sources
        ):
            return False  # another reader's or a stale attempt's answer, or a duplicate
        entry.state = target
        self.reached[target.value] += 1
        return True

    # -- the reader index ------------------------------------------------------------------

    def _place(self, entry: Assignment) -> None:
        """``entry`` is the split's now (replacing an UNASSIGNED one, which no reader has)."""
        old = self.entries.get(entry.split_id)
        if old is not None:
            self._unindex(old)
        self.entries[entry.split_id] = entry
        if entry.reader is not None:
            self._by_reader.setdefault(entry.reader, {})[entry.split_id] = entry

    def _unindex(self, entry: Assignment) -> None:
        held = self._by_reader.get(entry.reader)
        if held is not None:
            held.pop(entry.split_id, None)
            if not held:
                del self._by_reader[entry.reader]

    def _remove(self, split_id: str) -> None:
        entry = self.entries.pop(split_id)
        self._unindex(entry)
        self.bytes -= entry.size

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
        """Version 1 (entries without their sender and sequence: nothing could prove them) is
        refused, as is a newer one."""
        data = json.loads(text)
        if data.get("version") != TRACKER_VERSION:
            raise ValueError(f"unknown assignment tracker version {data.get('version')!r}")
        tracker = cls(max_entries, max_bytes)
        tracker._commands = data["commands"]
        for raw in data["entries"]:
            entry = Assignment(**{**raw, "state": S(raw["state"])})
            tracker._place(entry)
            tracker.bytes += entry.size
        return tracker
