"""One Lane A pipeline in this process, wired from the runtime's own pieces: an enumerator with
its assignment tracker, a reader (mailbox, event loop, FakeSource's managed reader) and a sink
that commits the rows of each completed checkpoint. A fault at a named point crashes the reader
or the coordinator once; recovery restores both sides from the last completed checkpoint, as
the engine does. What the sink committed is then compared with FakeSource's rows."""

from __future__ import annotations

import json

from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader
from engine.jobs.planner import plan_job
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.ownership import recent_split_ids
from engine.sourceruntime.reader import ReaderEventLoop, Snapshot, rows_of
from engine.sourceruntime.tracker import NOTHING, AssignmentTracker, Proof

#: The design's fault-injection points, in the order a command and a checkpoint pass them.
POINTS = (
    "command-creation",
    "operation-send",
    "capacity-reservation",
    "admission-ack",
    "connector-apply",
    "apply-completion",
    "apply-ack",
    "snapshot-before-registration",
    "registration-before-task-ack",
    "task-ack-before-forwarding",
    "completion-before-tracker-gc",
)
#: Where a fault at each point crashes: the reader's worker, the coordinator, or nothing (the
#: message is lost or refused, and the protocol's resends must cover it).
CRASHES = {
    "command-creation": "coordinator",
    "operation-send": "lost",
    "capacity-reservation": "refused",
    "admission-ack": "lost",
    "connector-apply": "reader",
    "apply-completion": "reader",
    "apply-ack": "lost",
    "snapshot-before-registration": "reader",
    "registration-before-task-ack": "reader",
    "task-ack-before-forwarding": "reader",
    "completion-before-tracker-gc": "coordinator",
}


class Crash(Exception):
    pass


class ManagedPipeline:
    def __init__(
        self,
        splits: int = 4,
        rows: int = 25,
        fault: str | None = None,
        faults: dict[str, set[int]] | None = None,
        abort_every: int | None = None,
        checkpoints: bool = True,
    ) -> None:
        """``fault``: one point, fired the second time it is reached; ``faults``: points and
        the occurrences at which they fire; ``abort_every``: every n-th periodic checkpoint
        aborts; ``checkpoints`` false: only the final one (what the sink commits at the end)."""
        plan = plan_job(
            # ``rows`` a split: FakeSource's row.num is the reader's, cut into its splits
            f"source {{ FakeSource {{ row.num = {rows * splits}, split.num = {splits} }} }}\n"
            "sink { Blackhole { } }"
        )
        node = plan.pipelines[0].source
        self.source = FakeSource(node.config, node.path)
        self.splits = {s["splitId"]: s for s in self.source.create_splits("BATCH")}
        self.faults = faults if faults is not None else ({fault: {2}} if fault else {})
        self.fired, self.reached = False, dict.fromkeys(POINTS, 0)
        self.abort_every, self.checkpoints_enabled = abort_every, checkpoints
        self.epoch, self.attempt, self.sequence = 1, 0, -1  # sequences run from 0
        self.tracker = AssignmentTracker()
        self.pending = sorted(self.splits)  # the enumerator's unassigned splits
        self.no_more_sent = False
        self.no_more_admitted = False
        self.outbox: list[SourceCommandEnvelope] = []
        self.committed: list[tuple] = []  # the sink's rows of completed checkpoints
        self.buffer: list[tuple] = []  # rows since the last barrier
        self.staged: dict[int, list[tuple]] = {}
        self.completed: tuple | None = None  # (checkpoint, reader snapshot, tracker, pending)
        self.checkpoint = 0
        self.recoveries = 0
        self.final_checkpoint: int | None = None  # the barrier sent once the input was read
        self.final_committed = False
        self.cuts: dict[int, tuple] = {}  # the enumerator's state at each barrier
        self._start_reader(None)

    # -- faults ---------------------------------------------------------------------------

    def at(self, point: str) -> bool:
        """True at the armed occurrences of a point: the caller then loses the message, or
        it crashes."""
        if point not in self.faults:
            return False
        self.reached[point] += 1
        if self.reached[point] in self.faults[point]:
            self.fired = True
            if CRASHES[point] in ("reader", "coordinator"):
                raise Crash(CRASHES[point])
            return True
        return False

    # -- the two sides --------------------------------------------------------------------

    def _start_reader(self, restored: Snapshot | None) -> None:
        self.attempt += 1
        self.mailbox = ReaderMailbox(1, "1/1", self.attempt, MailboxLimits(), WorkerBudget(10**9))
        self.reader = ManagedFakeReader(self.source)
        self.loop = ReaderEventLoop(
            self.mailbox,
            self.reader,
            PollLimits(max_records=7),
            lambda part: self.buffer.extend(rows_of([part])),  # a record batch, or rows
            self._on_snapshot,
            CAPABILITY.digest,
            may_close=lambda: self.final_committed,
        )
        if restored is not None:
            self.reader.restore(restored.state)
        self.loop.start(restored)

    def _send(
        self,
        kind: CommandKind,
        payload: dict | None = None,
        command_id: str | None = None,
        sequence: int | None = None,
    ):
        """A command of the coordinator (its epoch the sender), under a new sequence or, sent
        again, under its own."""
        if sequence is None:
            self.sequence += 1
            sequence = self.sequence
        body = json.dumps(payload).encode() if payload is not None else b""
        env = SourceCommandEnvelope.build(
            job_id=1,
            source_runtime_id="1/1",
            epoch=self.epoch,
            sender_attempt=self.epoch,
            target_attempt=self.attempt,
            sequence=sequence,
            command_id=command_id or f"{kind}:{self.epoch}:{sequence}",
            kind=kind,
            payload=body,
        )
        self.outbox.append(env)

    def assign(self) -> None:
        while self.pending:
            split_id = self.pending.pop(0)
            sequence = self.sequence + 1
            command = self.tracker.dispatch(split_id, 1, 0, self.attempt, self.epoch, sequence)
            self.at("command-creation")
            self._send(CommandKind.ASSIGN_SPLITS, {"splits": [self.splits[split_id]]}, command)
        # No-more-splits follows every assignment into the mailbox (FIFO): it is sent once
        # each assignment was admitted, never ahead of a lost or refused one.
        if not self.no_more_sent and self.tracker.all_admitted():
            self._send(CommandKind.NO_MORE_SPLITS, command_id=f"no-more:{self.attempt}")
            self.no_more_sent = True
            self.no_more_admitted = False

    def resend(self) -> None:
        """Assignments and no-more-splits not yet admitted go again under their command id."""
        queued = {env.commandId for env in self.outbox}
        if (
            self.no_more_sent
            and not self.no_more_admitted
            and f"no-more:{self.attempt}" not in queued
        ):
            self._send(CommandKind.NO_MORE_SPLITS, command_id=f"no-more:{self.attempt}")
        for entry in self.tracker.entries.values():
            if entry.state.value == "DISPATCHED" and entry.command_id not in queued:
                self._send(
                    CommandKind.ASSIGN_SPLITS,
                    {"splits": [self.splits[entry.split_id]]},
                    entry.command_id,
                    entry.sequence,
                )

    def deliver(self) -> None:
        outbox, self.outbox = self.outbox, []
        for env in outbox:
            if self.at("operation-send"):
                continue  # lost on the way: the tracker still says DISPATCHED
            if self.at("capacity-reservation"):
                self.outbox.append(env)  # RETRY_LATER: sent again later
                continue
            ack = self.mailbox.admit(env)
            if ack.status == AdmissionStatus.RETRY_LATER:
                self.outbox.append(env)
            elif ack.status in (AdmissionStatus.ACCEPTED, AdmissionStatus.DUPLICATE):
                if env.kind == CommandKind.NO_MORE_SPLITS:
                    self.no_more_admitted = True
                if env.kind == CommandKind.ASSIGN_SPLITS and not self.at("admission-ack"):
                    split_id = json.loads(env.payload)["splits"][0]["splitId"]
                    self.tracker.admitted(split_id, 0, self.attempt)

    def run_reader(self, steps: int = 50) -> None:
        for _ in range(steps):
            queued_kind = self._next_kind()
            if queued_kind == CommandKind.ASSIGN_SPLITS:
                self.at("connector-apply")
            if not self.loop.step():
                return
            if queued_kind == CommandKind.ASSIGN_SPLITS:
                self.at("apply-completion")
                for split_id in self.reader.splits:
                    if not self.at("apply-ack"):
                        self.tracker.applied(split_id, 0, self.attempt)

    def _next_kind(self) -> CommandKind | None:
        return None if self.mailbox.terminal else self.mailbox.next_ordered_kind()

    def barrier(self) -> None:
        self.checkpoint += 1
        self._send(CommandKind.CHECKPOINT, {"checkpoint": self.checkpoint})
        self.cuts[self.checkpoint] = (self.tracker.to_json(), list(self.pending), self.no_more_sent)

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        """Snapshot -> state registration -> task ack -> downstream forwarding -> global
        completion (one reader) -> tracker garbage collection."""
        self.at("snapshot-before-registration")
        registered = snapshot
        self.at("registration-before-task-ack")
        self.tracker.included(0, snapshot.checkpoint, Proof.of(snapshot.metadata))
        self.at("task-ack-before-forwarding")
        self.staged[snapshot.checkpoint], self.buffer[:] = list(self.buffer), []
        final = self.final_checkpoint is not None and snapshot.checkpoint >= self.final_checkpoint
        if not final and self.abort_every and snapshot.checkpoint % self.abort_every == 0:
            self.tracker.aborted(snapshot.checkpoint)  # its rows wait for a later checkpoint
            self.cuts.pop(snapshot.checkpoint, None)
            return
        for c in sorted(c for c in self.staged if c <= snapshot.checkpoint):
            self.committed += self.staged.pop(c)
        if self.final_checkpoint is not None and snapshot.checkpoint >= self.final_checkpoint:
            self.final_committed = True
        tracker, pending, no_more = self.cuts.pop(snapshot.checkpoint)
        self.completed = (snapshot.checkpoint, registered, tracker, pending, no_more)
        self.loop.checkpoint_completed(snapshot.checkpoint)  # its completion control
        self.at("completion-before-tracker-gc")
        self.tracker.completed(snapshot.checkpoint, {0: Proof.of(snapshot.metadata)})

    # -- recovery -------------------------------------------------------------------------

    def recover(self, side: str) -> None:
        """Both sides restart from the last completed checkpoint: the reader from its state
        and runtime metadata, the sink without what it had not committed. The new reader
        attempt registers with what its restored metadata proves: the coordinator (after a
        coordinator failover, a new epoch, its tracker restored from the same cut) keeps that
        the reader's, returns the rest, and confirms with a REGISTER command, its first to the
        attempt, its sequences going on above what the metadata applied."""
        self.recoveries += 1
        self.buffer[:] = []
        self.staged.clear()
        self.outbox.clear()
        restored = self.completed[1] if self.completed else None
        self._start_reader(restored)
        proof = Proof.of(restored.metadata) if restored else NOTHING
        held = recent_split_ids(restored.metadata) if restored else set()
        if side == "coordinator":
            self.epoch += 1
            tracker, pending, _no_more = (
                self.completed[2:]
                if self.completed
                else (AssignmentTracker().to_json(), sorted(self.splits), False)
            )
            self.tracker = AssignmentTracker.from_json(tracker)
            self.pending = [s for s in pending if s not in held]
        returned = self.tracker.reconcile(0, proof, self.attempt)
        self.final_checkpoint = None
        self.pending = sorted((set(self.pending) | set(returned)) - held)
        self.no_more_sent = False
        self.sequence = proof.next_sequence(self.epoch) - 1
        self._send(CommandKind.REGISTER, {"enumerator": []}, f"register:{self.attempt}")

    def run(self, rounds: int = 400) -> list[tuple]:
        for n in range(rounds):
            try:
                self.assign()
                if n % 3 == 2 and self.checkpoints_enabled:
                    self.barrier()
                if n % 5 == 4:
                    self.resend()
                self.deliver()
                self.run_reader()
            except Crash as crash:
                self.recover(str(crash))
                continue
            if self.loop.life.state == Life.CLOSED:
                return self.committed
            if self.loop.life.state == Life.DRAINING and (
                self.final_checkpoint is None or n % 6 == 5  # one lost: the next one
            ):
                self.barrier()  # the input is read: a final checkpoint commits the last rows
                self.final_checkpoint = self.checkpoint
        raise AssertionError(f"not finished after {rounds} rounds ({self.recoveries} recoveries)")

    def expected(self) -> list[tuple]:
        rows = []
        for split in self.splits.values():
            rows += self.reader.build(
                self.source.row_ids(split, "BATCH", 0, self.source.split_rows(split, "BATCH"))
            )
        return rows
