"""A reader task group in the managed lane (Lane A): its thread is the reader event loop.

Operation threads (the Celery handlers) only admit: an enumerator's commands and the master's
checkpoint barriers and completions become envelopes in the bounded reader mailbox, answered at
once. The task group's own thread runs the loop's steps; the rows of each poll turn go through
the transforms into the sinks before the next step, so a barrier's snapshot (reader state and
runtime metadata, never the mailbox) always matches what the sinks prepared. Sinks commit as in
Lane B (engine.member.commits): the completed checkpoint's row is the record.
"""

from __future__ import annotations

import json
import threading
import time

from engine.connectors import get_plugin
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import from_rows
from engine.connectors.managed import reader_for
from engine.connectors.schema import Schema
from engine.jobs import checkpoints, lifecycle
from engine.member import savemodes
from engine.member.commits import for_reader
from engine.member.dataplane import (
    METRICS_INTERVAL,
    Counters,
    PluginFailure,
    compile_chain,
    guarded,
    settle,
)
from engine.member.mailbox import Barrier, Message
from engine.models import TaskGroup
from engine.sourceruntime import SourceRuntime, check_restore
from engine.sourceruntime.capability import LaneMismatch, check_snapshot_versions
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import PROTOCOL_VERSION, AdmissionAck, SourceCommandEnvelope
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.reader import ReaderEventLoop, Snapshot

#: The longest the thread waits for a wakeup before it looks at commits and metrics again.
IDLE_WAIT = 0.05
#: Sender ids of the worker's own checkpoint sequencer (below every coordinator epoch).
BARRIER_SENDER, CALLBACK_SENDER = 0, -1


def runtime_id(job_id: int, pipeline_index: int) -> str:
    return f"{job_id}/{pipeline_index}"


def runtime_metrics(stats: dict, assignments: dict, extra: dict) -> dict:
    """A task group's ``sourceRuntime`` in job detail: bounded keys, no ids or payloads."""
    return {
        "mailbox": {
            key: stats.get(key, 0) for key in ("commands", "bytes", "reservedInUse", "oldestAgeMs")
        },
        "admissions": stats.get("admissions", {}),
        "assignments": assignments,
        **extra,
    }


class ManagedReaderTask:
    def __init__(self, thread, group: TaskGroup, budget: WorkerBudget) -> None:
        self.thread, self.group, self.budget = thread, group, budget
        self.wake = threading.Event()
        self.mailbox: ReaderMailbox | None = None
        self._lock = threading.Lock()
        self._offered = {BARRIER_SENDER: 0, CALLBACK_SENDER: 0}  # newest checkpoint admitted
        self._sequence = {BARRIER_SENDER: 0, CALLBACK_SENDER: 0}
        #: The rows of the step just run (the loop hands each step's list over, never reused).
        self._batches: list[list[tuple]] = []

    # -- operation threads ----------------------------------------------------------------

    def admit(self, envelope: SourceCommandEnvelope) -> AdmissionAck:
        mailbox = self.mailbox
        if mailbox is None:  # still starting: the sender tries again shortly
            return AdmissionAck(
                AdmissionStatus.RETRY_LATER,
                self.thread.attempt,
                retryAfterMillis=50,
                reasonCode="STARTING",
            )
        return mailbox.admit(envelope)

    def offer(self, message: Message) -> bool:
        """A master's barrier or completion, as an ordered control in the mailbox (checkpoint
        ids only grow: an older or repeated one is acknowledged and dropped)."""
        mailbox = self.mailbox
        if mailbox is None:
            return False  # a barrier is sent again until acked
        barrier = isinstance(message, Barrier)
        sender = BARRIER_SENDER if barrier else CALLBACK_SENDER
        kind = CommandKind.CHECKPOINT if barrier else CommandKind.CHECKPOINT_COMPLETE
        with self._lock:
            if message.checkpoint_id <= self._offered[sender]:
                return True
            sequence = self._sequence[sender] + 1
            envelope = SourceCommandEnvelope.build(
                job_id=mailbox.job_id,
                source_runtime_id=mailbox.runtime_id,
                epoch=mailbox.epoch,
                sender_attempt=sender,
                target_attempt=mailbox.attempt,
                sequence=sequence,
                command_id=f"{kind.value}:{message.checkpoint_id}",
                kind=kind,
                payload=json.dumps({"checkpoint": message.checkpoint_id}).encode(),
            )
            ack = mailbox.admit(envelope)
            if ack.status != AdmissionStatus.ACCEPTED:
                return ack.status == AdmissionStatus.DUPLICATE
            self._offered[sender], self._sequence[sender] = message.checkpoint_id, sequence
            return True

    def terminate(self, kind: CommandKind, reason: str) -> None:
        if self.mailbox is not None:
            self.mailbox.signal_terminal(kind, reason)
        self.wake.set()

    # -- the task group's thread ------------------------------------------------------------

    def run(self) -> Counters:
        thread, group = self.thread, self.group
        pipeline, job = group.pipeline, group.job
        plan = pipeline.plan
        source_node = plan["source"]
        recorded = SourceRuntime.from_json(plan.get("sourceRuntime"))
        latest = thread.db("finding its checkpoint", checkpoints.latest_completed, pipeline.id)
        own = {}
        if latest is not None:  # its snapshot there (a reader that had FINISHED: its final one)
            states = thread.db(
                "reading its checkpoint", checkpoints.acked_states, latest.id, [group.id]
            )
            own = (states.get(group.id) or {}).get("managed") or {}
        try:
            check_restore(recorded, get_plugin("source", source_node["plugin"]))
            if own:  # a snapshot of a runtime that reads what this one cannot: refused here
                if not isinstance(own.get("metadata"), dict):
                    raise LaneMismatch("the checkpoint's reader snapshot has no runtime metadata")
                check_snapshot_versions(own["metadata"], PROTOCOL_VERSION)
            if own and own["metadata"]["capabilityDigest"] != recorded.capability_digest:
                raise LaneMismatch(
                    f"the checkpoint's capability {own['metadata']['capabilityDigest']} is not "
                    f"the plan's {recorded.capability_digest}"
                )
        except LaneMismatch as exc:
            raise PluginFailure(source_node["path"], exc) from exc
        if not savemodes.before_first_row(thread, group):
            thread.stop.set()  # no longer ours: nothing opened, nothing written
            return Counters()
        commits, context = for_reader(thread, group, getattr(latest, "id", None))
        started, cpu_started = time.monotonic(), time.thread_time()
        source, chain = compile_chain(plan, context)
        counters = Counters()
        reader = guarded(source_node["path"], reader_for, source, job.mode)
        mailbox = ReaderMailbox(
            job.id,
            runtime_id(job.id, pipeline.index),
            thread.attempt,
            MailboxLimits.from_settings(),
            self.budget,
            wakeup=self.wake.set,
        )
        source_key = source_node["key"]
        schema = Schema.from_json(source_node["schema"])
        arrow = arrow_schema(schema)

        def flush() -> None:
            """The rows of the step just run, through the chain (as one Arrow batch each)
            before anything else."""
            if not self._batches:
                return
            # The step's turns as one batch: a turn holds a few dozen rows, and a batch costs
            # per batch as well as per row.
            rows = [row for turn in self._batches for row in turn]
            self._batches.clear()
            batch = from_rows(rows, schema, arrow)
            size = batch.nbytes
            written, written_bytes = chain.deliver(source_key, batch, size)
            counters.add(len(rows), written, size, written_bytes)

        def on_snapshot(snapshot: Snapshot) -> None:
            flush()
            sinks = [
                guarded(path, writer.prepare_commit, snapshot.checkpoint)
                for path, _, writer in chain.sinks
            ]
            state = {
                "managed": {"state": snapshot.state, "metadata": snapshot.metadata},
                "sinks": sinks,
            }
            if (
                commits.acknowledge(snapshot.checkpoint, state)
                and loop.close_latched
                and commits.final is None
            ):
                commits.final = snapshot.checkpoint  # its snapshot holds the end of the input

        def on_callback(kind: CommandKind, checkpoint: int) -> None:
            if kind == CommandKind.CHECKPOINT_COMPLETE:
                commits.apply(chain, now=True)

        loop = ReaderEventLoop(
            mailbox,
            reader,
            PollLimits.from_settings(),
            self._batches.append,
            on_snapshot,
            recorded.capability_digest or "",
            lineage=(own.get("metadata") or {}).get("readerAttemptLineage"),
            may_close=lambda: commits.input_done(chain),
            on_callback=on_callback,
        )
        completed = False
        try:
            if own:
                guarded(source_node["path"], reader.restore, own["state"])
                loop.start(Snapshot(latest.id, own["state"], own["metadata"]))
            else:
                loop.start()
            self.mailbox = mailbox  # from now on commands are admitted
            thread.mailbox.drain(self.offer)  # barriers that came before it was ready
            self._drive(loop, reader, flush, counters, commits, chain, source_node["path"])
            if loop.life.state == Life.CLOSED and not mailbox.terminal and not thread.stop.is_set():
                for path, _, writer in chain.sinks:
                    guarded(path, writer.close)
                completed = True
            elif thread.stop.is_set():
                commits.on_stopped(chain)
        finally:
            settle(chain, counters, started, cpu_started, completed)
        if mailbox.terminal.kind == CommandKind.FATAL:
            raise PluginFailure(source_node["path"], RuntimeError(mailbox.terminal.reason))
        return counters

    def _drive(self, loop, reader, flush, counters, commits, chain, path: str) -> None:
        thread = self.thread
        last_report = time.monotonic()
        while not thread.stop.is_set():
            self.wake.clear()
            try:
                worked = loop.step()
            except PluginFailure:
                raise
            except Exception as exc:  # a connector callback failed: the task group fails
                raise PluginFailure(path, exc) from exc
            flush()
            if loop.life.state == Life.CLOSED:
                counters.roll(chain)
                self._report(counters, loop, reader)  # its metrics as it ends
                return
            now = time.monotonic()
            if now - last_report >= METRICS_INTERVAL:
                last_report = now
                counters.roll(chain)
                if not self._report(counters, loop, reader):
                    thread.stop.set()  # the master moved on: stop at once
                    return
            commits.apply(chain)
            if not worked:
                self.wake.wait(loop.idle_for(IDLE_WAIT))

    def _report(self, counters: Counters, loop: ReaderEventLoop, reader) -> bool:
        metrics = loop.metrics
        extra = {
            "poll": {
                "turns": metrics.poll_turns,
                "records": metrics.records,
                "softOverruns": metrics.soft_overruns,
                "hardWakeups": metrics.hard_wakeups,
                "applied": metrics.applied,
                "staleCallbacks": metrics.stale_callbacks,
            },
            "lifecycle": loop.life.state.value,
        }
        held = {"APPLIED": len(getattr(reader, "splits", {}))}
        return self.thread.db(
            "reporting metrics",
            lifecycle.report_metrics,
            self.group.id,
            self.thread.attempt,
            self.thread.member_id,
            counters.received,
            counters.written,
            counters.rate,
            runtime_metrics(self.mailbox.stats(), held, extra),
            received_bytes=counters.received_bytes,
            written_bytes=counters.written_bytes,
            busy_seconds=counters.busy_seconds,
            blocked_seconds=counters.blocked_seconds,
        )
