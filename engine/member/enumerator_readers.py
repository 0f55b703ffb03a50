"""A Lane A enumerator's readers: which attempts it assigns to, and what their runtime metadata
proves. Part of the enumerator task (engine.member.managed_enumerator), on its coordinator loop.

- **Registration.** Each reader attempt registers as it starts (engine.member.enumerator_link)
  with what its restored snapshot's metadata proves. The enumerator reconciles the attempt
  (what the metadata proves is the reader's, the rest tracked for that reader returns to the
  pending splits), restarts the reader's sender sequences above what the metadata applied, and
  confirms with a REGISTER command, the first of those sequences. An attempt is assigned to
  only once the confirmation is admitted (so it precedes every assignment in the reader's FIFO
  mailbox), and only the newest attempt of each reader. A whole-pipeline restore reconciles
  every reader from the checkpoint before the loop starts (its cut is then consistent before
  its first snapshot), and the registrations find nothing left to return.
- **A reader's new attempt** (it was restored alone: engine.jobs.rollup) registers like any
  other: its old attempt's assignments that its restored metadata does not prove return to
  the pending splits, the commands to the old attempt are dropped, and its sequences restart
  above its restored watermark. A STALE_TARGET answer (a newer attempt runs where a command
  went) has the enumerator look its readers up on the shared pool: a reader whose attempt was
  replaced is sent nothing more until its new attempt registers.
- **Proofs.** An ASSIGNMENT_ACK moves the assignments of that reader's attempt to APPLIED
  (fenced by reader and attempt: every reader's attempts count from 1); a reader's
  SNAPSHOT report makes what its metadata proves CHECKPOINT_INCLUDED in that checkpoint; a
  checkpoint's abort (the master's) takes it back; the completion look-up (every
  COMPLETIONS_EVERY, on the shared pool) reads only the proof keys of the readers' snapshots in
  the newest completed checkpoint and settles every inclusion by them (engine.jobs
  .reader_metadata).
- **Source events.** A reader's SOURCE_EVENT (its backlog) counts if it comes from its
  registered attempt under this epoch (engine.member.enumerator_backlog); a newer attempt's
  registration drops the older one's report.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from django.db import close_old_connections

from engine.jobs import reader_metadata
from engine.member.enumerator_backlog import ReaderBacklogs
from engine.member.enumerator_link import ASSIGNMENT_ACK, REGISTER, SNAPSHOT, SOURCE_EVENT
from engine.models import TaskGroup
from engine.sourceruntime.choices import CommandKind
from engine.sourceruntime.coordinator import CoordinatorEventLoop
from engine.sourceruntime.ownership import recent_split_ids
from engine.sourceruntime.tracker import AssignmentTracker, Proof
from engine.states import TaskGroupKind


@dataclass(frozen=True)
class Target:
    """A reader's attempt, where its commands go."""

    index: int
    task_group_id: int
    attempt: int
    member_uuid: str
    member_name: str


def readers_of(pipeline_id: int) -> list[Target]:
    return [
        Target(g.index, g.id, g.attempt, str(g.member.uuid), g.member.name)
        for g in TaskGroup.objects.filter(pipeline_id=pipeline_id, kind=TaskGroupKind.READER)
        .select_related("member")
        .order_by("index")
        if g.member is not None
    ]


def current_readers(pipeline_id: int) -> list[Target]:
    """On the shared pool: the pipeline's readers as the database has them now."""
    close_old_connections()
    return readers_of(pipeline_id)


def completed_proofs(
    task_group_id: int, attempt: int, after: int, readers: tuple[tuple[int, int], ...]
) -> tuple[int, dict[int, dict | None]] | None:
    """On the shared pool: the newest completed checkpoint this attempt acked after ``after``,
    and the proof keys of each reader's snapshot in it, by reader index."""
    close_old_connections()
    checkpoint_id = reader_metadata.newest_completed(task_group_id, attempt, after)
    if checkpoint_id is None:
        return None
    metadata = reader_metadata.acked_metadata(checkpoint_id, [tg for _, tg in readers])
    return checkpoint_id, {index: metadata.get(tg) for index, tg in readers}


class ReaderRegistration:
    """The enumerator task's handling of its readers' messages and proofs (a part of
    ManagedEnumeratorTask, whose state it shares: tracker, targets, pending splits)."""

    group: TaskGroup
    loop: CoordinatorEventLoop
    tracker: AssignmentTracker
    expected: dict[int, Target]  # each reader's attempt as the database had it, or newer
    targets: dict[int, Target]  # registered attempts
    ready: set[int]  # readers whose registration confirmation was admitted
    pending: deque[str]
    splits: dict[str, dict]  # descriptions of pending and tracked splits
    completed_upto: int
    epoch: int
    reply: list
    sequences: dict[int, int]
    outstanding: dict
    in_flight: dict[int, int]
    no_more: set[int]
    backlogs: ReaderBacklogs

    def _on_reader_message(self, message: dict) -> bool:
        """A registration, an assignment acknowledgement, a snapshot report or a source event
        (True), or an admission answer (False: not one of these)."""
        kind = message.get("kind")
        if kind == REGISTER:
            self._on_register(message)
        elif kind == ASSIGNMENT_ACK:
            reader, attempt = message["reader"], message["attempt"]
            for split_id in message["splits"]:  # fenced by reader and attempt together
                self.tracker.applied(split_id, reader, attempt)
        elif kind == SNAPSHOT:
            checkpoint = message["checkpoint"]
            if message["reader"] in self.targets and checkpoint > self.completed_upto:
                proof = Proof.of(message["metadata"])
                self.tracker.included(message["reader"], checkpoint, proof)
        elif kind == SOURCE_EVENT:
            target = self.targets.get(message.get("reader"))
            current = target is not None and target.attempt == message.get("attempt")
            current = current and message.get("epoch") == self.epoch
            self.backlogs.event(message.get("reader"), message.get("event"), current)
            self._assign()  # a reader at its bound may have room again
        else:
            return False
        return True

    def _on_register(self, message: dict) -> None:
        index, attempt = message["reader"], message["attempt"]
        expected = self.expected.get(index)
        if expected is None or message["taskGroupId"] != expected.task_group_id:
            return  # not a reader of this pipeline
        current = self.targets.get(index)
        if attempt < expected.attempt or (current is not None and current.attempt >= attempt):
            return  # a stale attempt, or a registration repeated (its confirmation is out)
        metadata = message.get("metadata") or {}
        proof = Proof.of(metadata)
        returned = self.tracker.reconcile(index, proof, attempt)
        held = recent_split_ids(metadata)  # known already: this enumerator sent them
        pending = [s for s in [*self.pending, *returned] if s not in held]
        self.pending = deque(dict.fromkeys(pending))
        keep = {*self.pending, *self.tracker.entries}  # a proven split's description goes too
        self.splits = {s: split for s, split in self.splits.items() if s in keep}
        self._forget_attempt(index)
        target = Target(
            index, expected.task_group_id, attempt, message["memberUuid"], message["memberName"]
        )
        self.expected[index] = self.targets[index] = target
        # Its sequences go on above what its metadata applied: the gaps below are settled.
        self.sequences[index] = proof.next_sequence(self.epoch) - 1
        command_id = f"{REGISTER}:{self.epoch}:{index}:{attempt}"
        payload = json.dumps({"enumerator": self.reply}).encode()
        self._send(index, CommandKind.REGISTER, payload, command_id, None)

    def _on_stale_target(self) -> None:
        """A command reached a reader whose attempt is newer than its target: look the readers
        up (on the shared pool; one look-up at a time, the newest ask coalesced)."""
        pipeline_id = self.group.pipeline_id
        self.loop.call_async("readers", lambda: current_readers(pipeline_id), self._on_readers)

    def _on_readers(self, found: list[Target] | None, error: BaseException | None) -> None:
        """The readers' attempts now: one newer than the one registered was restored; its old
        attempt is sent nothing more (its commands would only be refused), and its new one is
        expected to register, which reconciles what the old one had."""
        if error is not None or not found:
            return  # asked again at the next STALE_TARGET
        for target in found:
            known = self.expected.get(target.index)
            if known is None or target.attempt <= known.attempt:
                continue
            self.expected[target.index] = target
            current = self.targets.get(target.index)
            if current is not None and current.attempt < target.attempt:
                self._forget_attempt(target.index)

    def _forget_attempt(self, index: int) -> None:
        """A newer attempt of reader ``index`` registered: nothing more goes to the older."""
        for command_id in [c for c, o in self.outstanding.items() if o.reader == index]:
            del self.outstanding[command_id]
        self.in_flight[index] = 0
        self.no_more.discard(index)
        self.ready.discard(index)
        self.backlogs.forget(index)

    def _restore_readers(self, metadata: dict[int, dict | None]) -> tuple[list[str], set[str]]:
        """Every reader's snapshot in the checkpoint restored from: each tracked assignment
        its metadata proves is the reader's, the rest returns to the enumerator (a reader not
        there now proves nothing). Returns (the split ids returned, those its recent
        assignments name: the reader's even if the enumerator's cut never saw them)."""
        returned = []
        for index in sorted({e.reader for e in self.tracker.entries.values()} - {None}):
            returned += self.tracker.reconcile(index, Proof.of(metadata.get(index)))
        held = set().union(*(recent_split_ids(m) for m in metadata.values()))
        return returned, held
