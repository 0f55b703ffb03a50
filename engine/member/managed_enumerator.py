"""The enumerator task group in the managed lane (Lane A): its thread runs the coordinator event
loop, the one owner of the enumerator's state (its discovery, its pending splits and the split
assignment tracker).

Splits are assigned to the readers' registered attempts (engine.member.enumerator_readers):
to the smallest backlog their SOURCE_EVENTs report (engine.member.enumerator_backlog), else
round-robin, one command per split, each with its tracker command id and a sender
sequence of its own per reader (so a reader's applied watermark has no gaps). Commands go out
through the worker's outbox; a reader's handler answers with its AdmissionAck as a command of
its own, which is posted to the loop, as are the readers' registrations, assignment
acknowledgements and snapshot reports. A command goes again under its id until admitted
(RETRY_LATER after its backoff; on silence after RESEND_AFTER, doubling up to RESEND_CAP
until it is answered: a dead reader is not sent its commands every second). Nothing here waits
on another process: checkpoint completions are looked up on the shared async pool and their
results applied on the loop, fenced by the coordinator epoch (the attempt).

A barrier snapshots the enumerator on the loop (tracker, pending splits and their descriptions,
the discovery's known splits; versioned, ``enumeratorStateVersion``). A whole-pipeline restore
(both a coordinator and a reader failover) takes the cut of the latest completed checkpoint and
reconciles it with what each reader's snapshot in that checkpoint proves by its runtime
metadata: proven assignments are the reader's, the rest tracked for it goes back to the pending
splits. A reader restored alone (this enumerator running on) is reconciled the same way when
its new attempt registers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from django.conf import settings

from engine.connectors.managed import discovery_for
from engine.jobs import checkpoints, lifecycle, reader_metadata
from engine.member.dataplane import METRICS_INTERVAL, PluginFailure, instantiate
from engine.member.enumerator_backlog import ReaderBacklogs
from engine.member.enumerator_readers import (
    ReaderRegistration,
    Target,
    completed_proofs,
    readers_of,
)
from engine.member.mailbox import Abort, Message
from engine.member.managed_reader import runtime_id, runtime_metrics
from engine.models import TaskGroup
from engine.outbox import Outbox
from engine.protocol import TASK_SOURCE_COMMAND, member_queue
from engine.sourceruntime.capability import (
    ENUMERATOR_STATE_VERSION,
    LaneMismatch,
    check_enumerator_state,
)
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.latency import LatencyHistogram
from engine.sourceruntime.tracker import AssignmentTracker, Proof, TrackerFull
from engine.states import JobMode

log = logging.getLogger("keel.enumerator")
#: An unanswered command is sent again after this many seconds (its answer may be lost).
RESEND_AFTER = 1.0
#: The longest wait between two resends of a command nothing answers (its reader may be gone).
RESEND_CAP = 8.0
RESEND_TICK = 0.1
COMPLETIONS_EVERY = 0.5
LIVENESS_EVERY = 0.5
IDLE_WAIT = 0.05
STEPS_PER_TURN = 200
#: Assignments one reader may have sent and not yet admitted: the rest wait as pending splits
#: (a split storm neither floods a reader's mailbox nor the worker's outbox).
SEND_WINDOW = 64
#: Nothing is assigned until every reader registered, or this long after the loop started (a
#: reader slow to start does not hold the others back for longer; one later is late, and
#: takes only splits found after it registered or returned to the enumerator).
REGISTRATION_GRACE = 10.0


@dataclass
class Outstanding:
    """A command sent and not yet admitted (ACCEPTED or DUPLICATE)."""

    reader: int
    sequence: int
    kind: CommandKind
    payload: bytes
    split_id: str | None
    due: float = 0.0
    backoff: float = 0.0
    since: float = 0.0
    #: Its wait for an answer before it goes again: doubled at each resend on silence (up to
    #: RESEND_CAP), 0 once answered (the next resend waits RESEND_AFTER again).
    silence: float = RESEND_AFTER


class ManagedEnumeratorTask(ReaderRegistration):
    def __init__(self, thread, group: TaskGroup, pool: SharedWorkerPool, outbox: Outbox) -> None:
        self.thread, self.group, self.pool, self.outbox = thread, group, pool, outbox
        self.epoch = thread.attempt
        self.wake = threading.Event()
        self.loop: CoordinatorEventLoop | None = None
        engine = settings.ENGINE
        self.tracker = AssignmentTracker(
            engine["source-runtime.tracker.max-entries"], engine["source-runtime.tracker.max-bytes"]
        )
        self.initial_backoff = engine["source-runtime.retry.initial-backoff"]
        self.max_backoff = engine["source-runtime.retry.max-backoff"]
        self.splits: dict[str, dict] = {}  # descriptions of pending and tracked splits
        self.pending: deque[str] = deque()  # at most max_pending of a listing source's
        self.max_pending = engine["source-runtime.discovery.max-pending"]
        self.expected: dict[int, Target] = {}  # the pipeline's readers (their attempts)
        self.targets: dict[int, Target] = {}  # registered attempts
        self.ready: set[int] = set()  # registered, and the confirmation admitted
        self.started = 0.0  # when the loop started (the registration grace runs from it)
        self.sequences: dict[int, int] = {}
        self.outstanding: dict[str, Outstanding] = {}
        self.no_more: set[int] = set()  # readers sent no-more-splits
        self.turn = 0
        self.completed_upto = 0
        self.acks: Counter[str] = Counter()
        self.backpressure = 0
        #: Publish to a reader's admission (ACCEPTED), through the outbox, broker and handler.
        self.admission_latency = LatencyHistogram()
        self.discovery = None
        self.in_flight: Counter[int] = Counter()  # assignments sent to a reader, not admitted
        self.backlogs = ReaderBacklogs(engine["source-runtime.assignment.max-reader-splits"])
        self.batch, self.checkpointing = False, True
        self.runtime_id, self.reply = "", []

    def bind(
        self,
        targets: list[Target],
        *,
        batch: bool,
        checkpointing: bool,
        runtime: str,
        reply: list,
    ) -> None:
        """Its readers (commands go to each once its attempt registered) and what the job
        asks."""
        self.expected = {t.index: t for t in targets}
        # Each reader's sequences run without gaps, so its applied watermark compacts.
        self.sequences = dict.fromkeys(self.expected, -1)
        self.batch, self.checkpointing = batch, checkpointing
        self.runtime_id, self.reply = runtime, reply
        self.started = time.monotonic()

    # -- operation threads ----------------------------------------------------------------

    def post_ack(self, answer: dict) -> None:
        """A reader's admission answer or other message: applied on the loop (before it runs:
        dropped, and the command, or the registration, goes again)."""
        loop = self.loop
        if loop is not None:
            loop.post(lambda: self._on_ack(answer))

    # -- the task group's thread ------------------------------------------------------------

    def run(self) -> None:
        thread, group = self.thread, self.group
        pipeline, job = group.pipeline, group.job
        targets = thread.db("finding its readers", readers_of, pipeline.id)
        member = thread.runtime.member
        self.bind(
            targets,
            batch=job.mode == JobMode.BATCH,
            checkpointing=bool(job.env.get("checkpoint.interval")),
            runtime=runtime_id(job.id, pipeline.index),
            reply=[group.id, self.epoch, str(member.uuid), member.name],
        )
        latest = thread.db("finding its checkpoint", checkpoints.latest_completed, pipeline.id)
        own, metadata = None, {}
        if latest is not None:
            states = thread.db(
                "reading its checkpoint", checkpoints.acked_states, latest.id, [group.id]
            )
            own = (states.get(group.id) or {}).get("managed")
            try:  # before anything runs
                if own:
                    check_enumerator_state(own)
            except LaneMismatch as exc:
                raise PluginFailure(pipeline.plan["source"]["path"], exc) from exc
            found = thread.db(
                "reading its readers' checkpoint",
                reader_metadata.acked_metadata,
                latest.id,
                [t.task_group_id for t in targets],
                recent=True,
            )
            metadata = {t.index: found.get(t.task_group_id) for t in targets}
        loop = CoordinatorEventLoop(self.pool, epoch=self.epoch, wakeup=self.wake.set)
        source = instantiate(pipeline.plan["source"])
        self.discovery = discovery_for(
            source, job.mode, loop, self._on_new, lambda: self.max_pending - len(self.pending)
        )
        if latest is not None:
            self._restore(own, metadata)
            self.completed_upto = latest.id
        self.loop = loop
        self.started = time.monotonic()
        self.discovery.start()
        loop.schedule_in_coordinator_thread("resend", RESEND_TICK, self._resend_tick)
        loop.schedule_in_coordinator_thread("completions", COMPLETIONS_EVERY, self._completions)
        loop.post(self._assign)
        self._drive(loop)

    def _restore(self, own: dict | None, metadata: dict[int, dict | None]) -> None:
        """The cut of the latest completed checkpoint, reconciled with what its readers'
        snapshots in it prove (``metadata``: their runtime metadata, by reader index)."""
        if own:
            self.tracker = AssignmentTracker.from_json(
                own["tracker"], self.tracker.max_entries, self.tracker.max_bytes
            )
            self.splits = dict(own["splits"])
            self.pending = deque(own["pending"])
        returned, held = self._restore_readers(metadata)
        pending = [s for s in [*self.pending, *returned] if s not in held]
        self.pending = deque(dict.fromkeys(pending))
        self.discovery.restore(own["known"] if own else None, held)
        keep = {*self.pending, *self.tracker.entries}
        self.splits = {s: split for s, split in self.splits.items() if s in keep}

    def _drive(self, loop: CoordinatorEventLoop) -> None:
        thread = self.thread
        next_check = next_report = 0.0
        while not thread.stop.is_set():
            self.wake.clear()
            thread.mailbox.drain(self._on_message)
            worked = False
            for _ in range(STEPS_PER_TURN):
                if not loop.step():
                    break
                worked = True
            now = time.monotonic()
            if now >= next_report:
                next_report = now + METRICS_INTERVAL
                self._report()
            if now >= next_check:
                next_check = now + LIVENESS_EVERY
                if not thread.db(
                    "looking at its readers", lifecycle.readers_live, self.group.pipeline_id
                ):
                    self._report()  # its metrics as it ends
                    return
                if not thread.still_current():
                    thread.stop.set()
                    return
            if not worked:
                self.wake.wait(IDLE_WAIT)

    def _on_message(self, message: Message) -> None:
        checkpoint_id = message.checkpoint_id
        if self.thread.first_barrier(message):
            self.loop.post(lambda: self._snapshot(checkpoint_id))
        elif isinstance(message, Abort):  # what its readers' snapshots proved is unproven
            self.loop.post(lambda: self.tracker.aborted(checkpoint_id))

    # -- on the loop ------------------------------------------------------------------------

    def _on_new(self, splits: list[dict]) -> None:
        for split in splits:
            self.splits[split["splitId"]] = split
            self.pending.append(split["splitId"])
        self._assign()

    def _assign(self) -> None:
        readers = sorted(self.ready)
        if len(readers) < len(self.expected):
            if time.monotonic() < self.started + REGISTRATION_GRACE:
                return  # the rest are starting: splits go round all of them
        while self.pending and readers:
            split_id = self.pending[0]
            turns = [readers[(self.turn + n) % len(readers)] for n in range(len(readers))]
            room = [r for r in turns if self.in_flight[r] < SEND_WINDOW]
            if room and all(self.backlogs.full(r) for r in room):
                self.backlogs.counts["full"] += 1  # their next reports open them again
                break
            room = [r for r in room if not self.backlogs.full(r)]
            if not room:
                break  # every reader's window is full: admissions open it again
            index = self.backlogs.choose(room)  # the smallest backlog reported, or the turn's
            payload = json.dumps({"splits": [self.splits[split_id]]}).encode()
            target, sequence = self.targets[index], self.sequences[index] + 1
            try:
                command_id = self.tracker.dispatch(
                    split_id, len(payload), index, target.attempt, self.epoch, sequence
                )
            except TrackerFull:
                self.backpressure += 1  # a completed checkpoint makes room
                break
            self.pending.popleft()
            self.backlogs.assigned(index, self.splits[split_id])
            self.turn = readers.index(index) + 1
            self.in_flight[index] += 1
            self._send(index, CommandKind.ASSIGN_SPLITS, payload, command_id, split_id)
        self._maybe_no_more()

    def _maybe_no_more(self) -> None:
        """A BATCH input ends once discovery is complete and every assignment was admitted:
        no-more-splits then follows every assignment in each reader's FIFO mailbox."""
        if not self.batch or self.ready <= self.no_more:
            return
        if self.discovery is None or not self.discovery.complete or self.pending:
            return
        if not self.tracker.all_admitted():
            return
        for index in sorted(self.ready - self.no_more):
            self.no_more.add(index)
            attempt = self.targets[index].attempt
            command_id = f"{CommandKind.NO_MORE_SPLITS.value}:{self.epoch}:{index}:{attempt}"
            self._send(index, CommandKind.NO_MORE_SPLITS, b"", command_id, None)

    def _send(
        self, index: int, kind: CommandKind, payload: bytes, command_id: str, split_id: str | None
    ) -> None:
        self.sequences[index] += 1
        command = Outstanding(index, self.sequences[index], kind, payload, split_id)
        command.since = time.monotonic()
        self.outstanding[command_id] = command
        self._publish(command_id, command)

    def _publish(self, command_id: str, command: Outstanding) -> None:
        target = self.targets[command.reader]
        envelope = SourceCommandEnvelope.build(
            job_id=self.group.job_id,
            source_runtime_id=self.runtime_id,
            epoch=self.epoch,
            sender_attempt=self.epoch,
            target_attempt=target.attempt,
            sequence=command.sequence,
            command_id=command_id,
            kind=command.kind,
            payload=command.payload,
        )
        command.due = time.monotonic() + (command.silence or RESEND_AFTER)
        self.outbox.put(
            TASK_SOURCE_COMMAND,
            [
                target.task_group_id,
                target.attempt,
                target.member_uuid,
                envelope.to_wire(),
                [*self.reply, time.time()],  # echoed with the admission's time
            ],
            member_queue(target.member_name),
            batch=True,  # the commands for one member share a message
        )

    def _on_ack(self, answer: dict) -> None:
        if self._on_reader_message(answer):
            return
        command = self.outstanding.get(answer["commandId"])
        ack = answer["ack"]
        status = AdmissionStatus(ack["status"])
        self.acks[status.value] += 1
        if command is None:
            return  # a late answer to a command admitted already
        command.silence = 0.0  # its reader answers: silence backs off afresh
        if status in (AdmissionStatus.ACCEPTED, AdmissionStatus.DUPLICATE):
            del self.outstanding[answer["commandId"]]
            if status == AdmissionStatus.ACCEPTED and "sentAt" in answer:
                self.admission_latency.record(max(answer["admittedAt"] - answer["sentAt"], 0.0))
            if command.kind == CommandKind.REGISTER:
                self.ready.add(command.reader)  # assignments follow it in the mailbox
            if command.split_id is not None:
                self.in_flight[command.reader] -= 1
                target = self.targets[command.reader]
                self.tracker.admitted(command.split_id, target.index, target.attempt)
                if not self.checkpointing:
                    self.tracker.forget(command.split_id)  # no checkpoint will prove it
                    self.splits.pop(command.split_id, None)
            self._assign()
        elif status == AdmissionStatus.RETRY_LATER:
            after = (ack.get("retryAfterMillis") or 0) / 1000
            command.backoff = min(
                max(command.backoff * 2, after, self.initial_backoff), self.max_backoff
            )
            command.due = time.monotonic() + command.backoff
        elif status in (AdmissionStatus.INVALID_PAYLOAD, AdmissionStatus.UNSUPPORTED_PROTOCOL):
            # Sending it again cannot help: the task group fails (and its pipeline restores).
            raise RuntimeError(
                f"reader {command.reader} refused a {command.kind.value} command: "
                f"{status.value} {ack.get('reasonCode')}"
            )
        else:
            # A reader attempt that is gone (restored: its new attempt registers, or its
            # pipeline with this enumerator) or a refusal: kept, and sent again at the slow
            # pace until then.
            if status == AdmissionStatus.STALE_TARGET:
                self._on_stale_target()  # which attempt is the reader's now?
            log.warning(
                "job %s reader %s refused a %s command: %s %s",
                self.group.job_id,
                command.reader,
                command.kind.value,
                status.value,
                ack.get("reasonCode"),
            )

    def _resend_tick(self) -> None:
        now = time.monotonic()
        for command_id, command in list(self.outstanding.items()):
            if command.due <= now:
                silence = command.silence
                command.silence = min(silence * 2, RESEND_CAP) if silence else RESEND_AFTER
                self._publish(command_id, command)
        self._maybe_no_more()  # a discovery that completed with nothing new
        if self.pending and len(self.ready) < len(self.expected):
            self._assign()  # the registration grace may have ended
        self.loop.schedule_in_coordinator_thread("resend", RESEND_TICK, self._resend_tick)

    def _completions(self) -> None:
        readers = tuple((t.index, t.task_group_id) for t in self.expected.values())
        group_id, attempt, after = self.group.id, self.thread.attempt, self.completed_upto
        self.loop.call_async(
            "completions",
            lambda: completed_proofs(group_id, attempt, after, readers),
            self._on_completed,
        )
        self.loop.schedule_in_coordinator_thread(
            "completions", COMPLETIONS_EVERY, self._completions
        )

    def _on_completed(self, found, error: BaseException | None) -> None:
        if error is not None or found is None or found[0] <= self.completed_upto:
            return  # a failed look-up is asked again at the next tick
        checkpoint_id, metadata = found
        proofs = {index: Proof.of(m) for index, m in metadata.items()}
        for split_id in self.tracker.completed(checkpoint_id, proofs):
            self.splits.pop(split_id, None)
        self.completed_upto = checkpoint_id
        self._assign()  # room for assignments the tracker's bounds held back

    def _snapshot(self, checkpoint_id: int) -> None:
        tracked = [*self.pending, *self.tracker.entries]
        state = {
            "kind": "enumerator",
            "managed": {
                "enumeratorStateVersion": ENUMERATOR_STATE_VERSION,
                "tracker": self.tracker.to_json(),
                "pending": list(self.pending),
                "splits": {s: self.splits[s] for s in tracked if s in self.splits},
                "known": self.discovery.snapshot(),
                "epoch": self.epoch,
            },
        }
        self.thread.db(
            "acknowledging a barrier",
            checkpoints.acknowledge,
            checkpoint_id,
            self.group.id,
            self.thread.attempt,
            state,
        )

    def _report(self) -> None:
        now = time.monotonic()
        waiting = list(self.outstanding.values())
        stats = {
            "commands": len(waiting),
            "bytes": sum(len(c.payload) for c in waiting),
            "reservedInUse": 0,
            "oldestAgeMs": round((now - min(c.since for c in waiting)) * 1000) if waiting else 0,
            "admissions": dict(self.acks),
        }
        loop = self.loop
        extra = {
            "coordinator": {
                "epoch": self.epoch,
                "pendingSplits": len(self.pending),
                "trackerBytes": self.tracker.bytes,
                "backpressure": self.backpressure,
                "registered": len(self.ready),
                "asyncInFlight": loop.in_flight,
                **{key: loop.metrics.get(key, 0) for key in COORDINATOR_COUNTERS},
            },
            "assignmentsReached": dict(self.tracker.reached),
            "publishToAdmissionMs": self.admission_latency.to_json(),
            "discovery": self.discovery.metrics(),
            "sourceEvents": self.backlogs.metrics(),
        }
        self.thread.db(
            "reporting metrics",
            lifecycle.report_metrics,
            self.group.id,
            self.thread.attempt,
            self.thread.member_id,
            0,
            0,
            0.0,
            runtime_metrics(stats, self.tracker.counts(), extra),
        )


COORDINATOR_COUNTERS = ("executions", "coalesced", "stale_results", "timeouts", "failures")
