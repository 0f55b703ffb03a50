"""The enumerator task group in the managed lane (Lane A): its thread runs the coordinator event
loop, the one owner of the enumerator's state (its discovery, its pending splits and the split
assignment tracker).

Splits are assigned round-robin to the readers' current attempts, one command per split, each
with its tracker command id and a sender sequence of its own per reader (so a reader's applied
watermark has no gaps). Commands go out through the worker's outbox; a reader's handler answers
with its AdmissionAck as a command of its own, which is posted to the loop. A command goes again
under its id until admitted (RETRY_LATER after its backoff, silence after RESEND_AFTER). Nothing
here waits on another process: checkpoint completions are looked up on the shared async pool
and their results applied on the loop, fenced by the coordinator epoch (the attempt).

A barrier snapshots the enumerator on the loop (tracker, pending splits and their descriptions,
the discovery's known splits). A restore (every restore is both a coordinator and a reader
failover: the whole pipeline is redeployed) takes the cut of the latest completed checkpoint and
reconciles it with what each reader's snapshot in that checkpoint holds: held splits are the
reader's, the rest tracked for it goes back to the pending splits.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections

from engine.connectors.managed import discovery_for
from engine.jobs import checkpoints, lifecycle
from engine.member.dataplane import METRICS_INTERVAL, instantiate
from engine.member.mailbox import Message
from engine.member.managed_reader import runtime_id, runtime_metrics
from engine.models import TaskGroup
from engine.outbox import Outbox
from engine.protocol import TASK_SOURCE_COMMAND, member_queue
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.tracker import AssignmentTracker, TrackerFull
from engine.states import JobMode, TaskGroupKind

log = logging.getLogger("keel.enumerator")
#: An unanswered command is sent again after this many seconds (its answer may be lost).
RESEND_AFTER = 1.0
RESEND_TICK = 0.1
COMPLETIONS_EVERY = 0.5
LIVENESS_EVERY = 0.5
IDLE_WAIT = 0.05
STEPS_PER_TURN = 200
#: Assignments one reader may have sent and not yet admitted: the rest wait as pending splits
#: (a split storm neither floods a reader's mailbox nor the worker's outbox).
SEND_WINDOW = 64


@dataclass(frozen=True)
class Target:
    """A reader's current attempt, where its commands go."""

    index: int
    task_group_id: int
    attempt: int
    member_uuid: str
    member_name: str


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


def readers_of(pipeline_id: int) -> list[Target]:
    return [
        Target(g.index, g.id, g.attempt, str(g.member.uuid), g.member.name)
        for g in TaskGroup.objects.filter(pipeline_id=pipeline_id, kind=TaskGroupKind.READER)
        .select_related("member")
        .order_by("index")
        if g.member is not None
    ]


def completed_cut(
    task_group_id: int, attempt: int, after: int, readers: tuple[tuple[int, int], ...]
) -> tuple[int, dict[int, set[str]]] | None:
    """On the shared pool: the newest completed checkpoint this attempt acked after ``after``,
    and the split ids each reader's snapshot in it holds."""
    close_old_connections()
    found = checkpoints.completed_since(task_group_id, attempt, after)
    if found is None:
        return None
    checkpoint_id = found[0]
    states = checkpoints.acked_states(checkpoint_id, [tg for _, tg in readers])
    return checkpoint_id, {index: held_splits(states.get(tg, {})) for index, tg in readers}


def held_splits(state: dict) -> set[str]:
    return set(((state.get("managed") or {}).get("state") or {}).get("offsets") or {})


class ManagedEnumeratorTask:
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
        self.pending: list[str] = []
        self.targets: dict[int, Target] = {}
        self.sequences: dict[int, int] = {}
        self.outstanding: dict[str, Outstanding] = {}
        self.no_more: set[int] = set()  # readers sent no-more-splits
        self.turn = 0
        self.completed_upto = 0
        self.acks: Counter[str] = Counter()
        self.backpressure = 0
        self.discovery = None
        self.in_flight: Counter[int] = Counter()  # assignments sent to a reader, not admitted
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
        """Where its commands go (the readers' current attempts) and what the job asks."""
        self.targets = {t.index: t for t in targets}
        # Each reader's sequences run from 0 without gaps, so its applied watermark compacts.
        self.sequences = dict.fromkeys(self.targets, -1)
        self.batch, self.checkpointing = batch, checkpointing
        self.runtime_id, self.reply = runtime, reply

    # -- operation threads ----------------------------------------------------------------

    def post_ack(self, answer: dict) -> None:
        """A reader's admission answer: applied on the loop (before it runs: dropped, and the
        command goes again)."""
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
        loop = CoordinatorEventLoop(self.pool, epoch=self.epoch, wakeup=self.wake.set)
        source = instantiate(pipeline.plan["source"])
        self.discovery = discovery_for(source, job.mode, loop, self._on_new)
        if latest is not None:
            states = thread.db(
                "reading its checkpoint",
                checkpoints.acked_states,
                latest.id,
                [group.id, *(t.task_group_id for t in targets)],
            )
            self._restore(
                (states.get(group.id) or {}).get("managed"),
                {t.index: held_splits(states.get(t.task_group_id, {})) for t in targets},
            )
            self.completed_upto = latest.id
        self.loop = loop
        self.discovery.start()
        loop.schedule_in_coordinator_thread("resend", RESEND_TICK, self._resend_tick)
        loop.schedule_in_coordinator_thread("completions", COMPLETIONS_EVERY, self._completions)
        loop.post(self._assign)
        self._drive(loop)

    def _restore(self, own: dict | None, held: dict[int, set[str]]) -> None:
        """The cut of the latest completed checkpoint, reconciled with what its readers hold."""
        if own:
            self.tracker = AssignmentTracker.from_json(
                own["tracker"], self.tracker.max_entries, self.tracker.max_bytes
            )
            self.splits = dict(own["splits"])
            self.pending = list(own["pending"])
        every_held = set().union(*held.values()) if held else set()
        returned = []
        for index, ids in held.items():
            returned += self.tracker.reconcile(index, ids)
        for entry in list(self.tracker.entries.values()):
            if entry.reader is not None and entry.reader not in held:
                returned += self.tracker.reader_failed(entry.reader)  # a reader not there now
        pending = [s for s in [*self.pending, *returned] if s not in every_held]
        self.pending = list(dict.fromkeys(pending))
        self.discovery.restore(set(own["known"] if own else ()) | every_held)
        for split_id in every_held:
            self.splits.pop(split_id, None)

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
        if self.thread.first_barrier(message):
            checkpoint_id = message.checkpoint_id
            self.loop.post(lambda: self._snapshot(checkpoint_id))

    # -- on the loop ------------------------------------------------------------------------

    def _on_new(self, splits: list[dict]) -> None:
        for split in splits:
            self.splits[split["splitId"]] = split
            self.pending.append(split["splitId"])
        self._assign()

    def _assign(self) -> None:
        readers = sorted(self.targets)
        while self.pending and readers:
            split_id = self.pending[0]
            turns = [readers[(self.turn + n) % len(readers)] for n in range(len(readers))]
            index = next((r for r in turns if self.in_flight[r] < SEND_WINDOW), None)
            if index is None:
                break  # every reader's window is full: admissions open it again
            payload = json.dumps({"splits": [self.splits[split_id]]}).encode()
            try:
                command_id = self.tracker.dispatch(
                    split_id, len(payload), index, self.targets[index].attempt, self.epoch
                )
            except TrackerFull:
                self.backpressure += 1  # a completed checkpoint makes room
                break
            self.pending.pop(0)
            self.turn = readers.index(index) + 1
            self.in_flight[index] += 1
            self._send(index, CommandKind.ASSIGN_SPLITS, payload, command_id, split_id)
        self._maybe_no_more()

    def _maybe_no_more(self) -> None:
        """A BATCH input ends once discovery is complete and every assignment was admitted:
        no-more-splits then follows every assignment in each reader's FIFO mailbox."""
        if not self.batch or set(self.targets) <= self.no_more:
            return
        if not self.discovery.complete or self.pending:
            return
        if not self.tracker.all_admitted():
            return
        for index in sorted(set(self.targets) - self.no_more):
            self.no_more.add(index)
            command_id = f"{CommandKind.NO_MORE_SPLITS.value}:{self.epoch}:{index}"
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
        command.due = time.monotonic() + RESEND_AFTER
        self.outbox.put(
            TASK_SOURCE_COMMAND,
            [
                target.task_group_id,
                target.attempt,
                target.member_uuid,
                envelope.to_wire(),
                self.reply,
            ],
            member_queue(target.member_name),
        )

    def _on_ack(self, answer: dict) -> None:
        command = self.outstanding.get(answer["commandId"])
        ack = answer["ack"]
        status = AdmissionStatus(ack["status"])
        self.acks[status.value] += 1
        if command is None:
            return  # a late answer to a command admitted already
        if status in (AdmissionStatus.ACCEPTED, AdmissionStatus.DUPLICATE):
            del self.outstanding[answer["commandId"]]
            if command.split_id is not None:
                self.in_flight[command.reader] -= 1
                self.tracker.admitted(command.split_id, self.targets[command.reader].attempt)
                if not self.checkpointing:
                    self.tracker.forget(command.split_id)  # no checkpoint will prove it
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
            # A reader attempt that is gone (its pipeline is being restored, this enumerator
            # with it) or a refusal: kept, and sent again at the slow pace until then.
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
                self._publish(command_id, command)
        self._maybe_no_more()  # a discovery that completed with nothing new
        self.loop.schedule_in_coordinator_thread("resend", RESEND_TICK, self._resend_tick)

    def _completions(self) -> None:
        readers = tuple((t.index, t.task_group_id) for t in self.targets.values())
        group_id, attempt, after = self.group.id, self.thread.attempt, self.completed_upto
        self.loop.call_async(
            "completions",
            lambda: completed_cut(group_id, attempt, after, readers),
            self._on_completed,
        )
        self.loop.schedule_in_coordinator_thread(
            "completions", COMPLETIONS_EVERY, self._completions
        )

    def _on_completed(self, found, error: BaseException | None) -> None:
        if error is not None or found is None or found[0] <= self.completed_upto:
            return  # a failed look-up is asked again at the next tick
        checkpoint_id, held = found
        for index, ids in held.items():
            target = self.targets.get(index)
            if target is not None:
                self.tracker.included(index, target.attempt, checkpoint_id, ids)
        for split_id in self.tracker.completed(checkpoint_id):
            self.splits.pop(split_id, None)
        self.completed_upto = checkpoint_id
        self._assign()  # room for assignments the tracker's bounds held back

    def _snapshot(self, checkpoint_id: int) -> None:
        tracked = [*self.pending, *self.tracker.entries]
        state = {
            "kind": "enumerator",
            "managed": {
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
                "asyncInFlight": loop.in_flight,
                **{key: loop.metrics.get(key, 0) for key in COORDINATOR_COUNTERS},
            }
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
