"""A reader task group in the managed lane (Lane A): its thread is the reader event loop.

Operation threads (the Celery handlers) only admit: an enumerator's commands and the master's
checkpoint barriers and completions become envelopes in the bounded reader mailbox, answered at
once. The task group's own thread runs the loop's steps; the rows of each poll turn go through
the transforms into the sinks before the next step, so a barrier's snapshot (reader state and
runtime metadata, never the mailbox) always matches what the sinks prepared. Sinks commit as in
Lane B (engine.member.commits): the completed checkpoint's row is the record."""

from __future__ import annotations

import json
import logging
import threading
import time

from django.db import connections

from engine.connectors import get_plugin
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import limits as batch_limits
from engine.connectors.managed import RUNTIMES, reader_for
from engine.connectors.schema import Schema
from engine.jobs import checkpoints, lifecycle
from engine.member import savemodes, tasklog_shipping
from engine.member.adopted_writers import settle_adopted
from engine.member.commits import for_reader
from engine.member.dataplane import (
    METRICS_INTERVAL,
    Counters,
    PluginFailure,
    compile_chain,
    guarded,
    settle,
    sized_parts,
)
from engine.member.enumerator_link import EnumeratorLink, enumerator_of
from engine.member.mailbox import Abort, Barrier, Message
from engine.member.schema_follow import evolved_plan, follow_restored, follow_sinks, recompile
from engine.member.step_batches import step_batches
from engine.member.tasklogs import attributed
from engine.models import TaskGroup
from engine.sourceruntime import SourceRuntime, check_restore
from engine.sourceruntime.capability import LaneMismatch, check_snapshot_versions
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import PROTOCOL_VERSION, AdmissionAck, SourceCommandEnvelope
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.reader import ReaderEventLoop, Snapshot
from engine.sourceruntime.schema_change import SchemaChangePending
from engine.sourceruntime.watchdog import PollStuck, watchdog
from engine.states import ExecutionStatus

log = logging.getLogger("keel.sourceruntime")

#: The longest the thread waits for a wakeup before it looks at commits and metrics again.
IDLE_WAIT = 0.05
#: Sender ids of the worker's own checkpoint sequencer (below every coordinator epoch), and
#: of the master's graceful close (a member drain: one command an attempt; -2 is availability's).
BARRIER_SENDER, CALLBACK_SENDER, CLOSE_SENDER = 0, -1, -3


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
        #: Its messages to the enumerator (registration, acknowledgements, snapshot reports).
        self.link: EnumeratorLink | None = None
        self._completed = 0  # the newest completed checkpoint its event loop was told of
        self._offered = {BARRIER_SENDER: 0, CALLBACK_SENDER: 0}  # newest checkpoint admitted
        self._sequence = {BARRIER_SENDER: 0, CALLBACK_SENDER: 0}
        #: The records of the step just run, as the loop hands them over: record batches and
        #: lists of rows (``PollContext.settle``), delivered by ``flush`` before the next step.
        self._parts: list = []
        #: Failed by the poll watchdog (its call did not return in time): this thread, if its
        #: call ever returns, hands nothing more to the sinks.
        self.abandoned = False
        #: A member drain asked this attempt to close gracefully (engine.jobs.graceful_close),
        #: and the checkpoint whose snapshot, committed, holds where it stopped reading.
        self.closing = False
        self.closed_at: int | None = None

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
        """A master's barrier, completion or abort, as an ordered control in the mailbox
        (checkpoint ids only grow: an older or repeated one is acknowledged and dropped)."""
        mailbox = self.mailbox
        if mailbox is None:
            return False  # a barrier is sent again until acked
        barrier = isinstance(message, Barrier)
        sender = BARRIER_SENDER if barrier else CALLBACK_SENDER
        kind = CommandKind.CHECKPOINT if barrier else CommandKind.CHECKPOINT_COMPLETE
        if isinstance(message, Abort):
            kind = CommandKind.CHECKPOINT_ABORT
        with self._lock:
            if message.checkpoint_id <= self._offered[sender]:
                return True
            sequence = self._sequence[sender] + 1
            payload = json.dumps({"checkpoint": message.checkpoint_id}).encode()
            command = f"{kind.value}:{message.checkpoint_id}"
            status = self._admit_own(mailbox, kind, sender, sequence, command, payload)
            if status != AdmissionStatus.ACCEPTED:
                return status == AdmissionStatus.DUPLICATE
            self._offered[sender], self._sequence[sender] = message.checkpoint_id, sequence
            return True

    def close_gracefully(self) -> bool:
        """A member drain's graceful close, as an ordered control (reserved capacity): the
        reader stops polling, its next snapshot is its last, and once that checkpoint is
        committed it reports where it closed and idles until the master moves it. Admitted
        once an attempt; a repeat (the master sends it until answered) is acknowledged. A
        reader already closing at the end of its input goes on to finish instead."""
        mailbox = self.mailbox
        if mailbox is None:
            return False  # still starting: sent again
        with self._lock:
            if self.closing:
                return True
            self.closing = True  # before admission: the loop may apply it at once
            kind = CommandKind.GRACEFUL_CLOSE
            status = self._admit_own(mailbox, kind, CLOSE_SENDER, 1, kind.value, b"")
            if status not in (AdmissionStatus.ACCEPTED, AdmissionStatus.DUPLICATE):
                self.closing = False
                return False
            return True

    @staticmethod
    def _admit_own(
        mailbox: ReaderMailbox,
        kind: CommandKind,
        sender: int,
        sequence: int,
        command: str,
        payload: bytes,
    ) -> AdmissionStatus:
        """One of the worker's own controls into the mailbox: its admission's answer."""
        envelope = SourceCommandEnvelope.build(
            job_id=mailbox.job_id,
            source_runtime_id=mailbox.runtime_id,
            epoch=mailbox.epoch,
            sender_attempt=sender,
            target_attempt=mailbox.attempt,
            sequence=sequence,
            command_id=command,
            kind=kind,
            payload=payload,
        )
        return mailbox.admit(envelope).status

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
        address = thread.db("finding its enumerator", enumerator_of, pipeline.id)
        own = {}
        if latest is not None:  # its snapshot there (a reader that had FINISHED: its final one)
            states = thread.db(
                "reading its checkpoint", checkpoints.acked_states, latest.id, [group.id]
            )
            own = (states.get(group.id) or {}).get("managed") or {}
            adopted = (states.get(group.id) or {}).get("adoptedWriters") or []  # a rescale's
        try:
            plugin = get_plugin("source", source_node["plugin"])
            check_restore(recorded, plugin)
            if own:  # a snapshot of a runtime that reads what this one cannot: refused here
                if not isinstance(own.get("metadata"), dict):
                    raise LaneMismatch("the checkpoint's reader snapshot has no runtime metadata")
                state_version = RUNTIMES[plugin.name][0].STATE_VERSION
                check_snapshot_versions(own["metadata"], PROTOCOL_VERSION, state_version)
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
        limits = PollLimits.from_settings()
        restored_schema = own.get("schema")  # a schema change's, in effect from its checkpoint
        if restored_schema is not None:
            plan = guarded(
                source_node["path"],
                follow_restored,
                plan,
                restored_schema,
                time.monotonic() + limits.schema_change_timeout,
                thread.stop,
            )
            if plan is None:  # told to stop while the sinks' lock was held: nothing opened
                return Counters()
        if latest is not None and adopted:  # removed readers' sinks: their commits, once
            settle_adopted(plan, context, adopted)
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
        shape = {"schema": Schema.from_json(plan["source"]["schema"])}  # the one in effect
        shape["arrow"] = arrow_schema(shape["schema"])
        max_rows, max_bytes = batch_limits()
        if restored_schema is not None:
            guarded(source_node["path"], reader.schema_changed, restored_schema)

        def flush() -> None:
            """The records of the step just run, through the chain before anything else: as
            one batch (``step_batches``), within the data plane's bounds as Lane B's are."""
            if not self._parts:
                return
            batches = step_batches(self._parts, shape["schema"], shape["arrow"])
            self._parts.clear()
            for batch in batches:
                for part, size in sized_parts(batch, max_rows, max_bytes):
                    written, written_bytes = chain.deliver(source_key, part, size)
                    counters.add(part.num_rows, written, size, written_bytes)

        def on_snapshot(snapshot: Snapshot) -> None:
            flush()
            sinks = [
                guarded(path, writer.prepare_commit, snapshot.checkpoint)
                for path, _, writer in chain.sinks
            ]
            managed = {"state": snapshot.state, "metadata": snapshot.metadata}
            if snapshot.schema is not None:  # a restore from here runs this schema
                managed["schema"] = snapshot.schema
            state = {"managed": managed, "sinks": sinks}
            acked = commits.acknowledge(snapshot.checkpoint, state)
            if acked:
                self.link.snapshot(snapshot.checkpoint, snapshot.metadata)
            if acked and loop.close_latched and commits.final is None:
                commits.final = snapshot.checkpoint  # its snapshot holds the end of the input

        def on_callback(kind: CommandKind, checkpoint: int) -> None:
            if kind == CommandKind.CHECKPOINT_COMPLETE:
                commits.apply(chain, now=True)

        def apply_schema(schema: list) -> None:
            """The schema checkpoint completed: once nothing of the old schema is left
            uncommitted, the sinks take the new columns and the chain is compiled again."""
            nonlocal plan
            if commits.checkpointing and commits.acked > commits.committed:
                raise SchemaChangePending("the old schema's checkpoint is not committed", False)
            flush()
            evolved = evolved_plan(plan, schema)
            follow_sinks(plan, evolved)
            context["restoredCheckpoint"] = commits.committed or None
            recompile(chain, evolved, context)
            plan = evolved
            shape["schema"] = Schema.from_json(schema)
            shape["arrow"] = arrow_schema(shape["schema"])
            log.info("task group %s: schema change applied (%s)", group.id, schema)

        def request_checkpoint() -> None:
            thread.db(
                "asking for a schema checkpoint",
                lifecycle.request_checkpoint,
                group.id,
                thread.attempt,
                thread.member_id,
            )

        def on_applied(kind: CommandKind, payload: dict) -> None:
            if kind == CommandKind.REGISTER:
                self.link.confirm(payload)
            else:
                self.link.applied(payload)  # acknowledged after this step

        loop = ReaderEventLoop(
            mailbox,
            reader,
            limits,
            self._parts.append,
            on_snapshot,
            recorded.capability_digest or "",
            lineage=(own.get("metadata") or {}).get("readerAttemptLineage"),
            may_close=lambda: self._may_close(commits, chain, counters, loop, reader),
            on_callback=on_callback,
            on_applied=on_applied,
            checkpointing=commits.checkpointing,
            request_checkpoint=request_checkpoint,
            apply_schema=apply_schema,
        )
        self.link = EnumeratorLink(thread.runtime.outbox, group.index, thread.attempt, address)
        self.link.events_from(getattr(reader, "source_event", None))  # ephemeral SOURCE_EVENTs
        self.counters, self.source_path = counters, source_node["path"]
        watchdog().watch(loop.watch, self._abandon)  # wakes its poll calls past their budget
        completed = False
        try:
            if own:
                guarded(source_node["path"], reader.restore, own["state"])
                loop.start(Snapshot(latest.id, own["state"], own["metadata"], restored_schema))
            else:
                loop.start()
            self.mailbox = mailbox  # from now on commands are admitted
            member = thread.runtime.member
            self.link.register(group.id, str(member.uuid), member.name, loop.metadata())
            thread.mailbox.drain(self.offer)  # barriers that came before it was ready
            self._drive(loop, reader, flush, counters, commits, chain, source_node["path"])
            if loop.life.state == Life.CLOSED and not mailbox.terminal and not thread.stop.is_set():
                for path, _, writer in chain.sinks:
                    guarded(path, writer.close)
                completed = True
            elif thread.stop.is_set():
                commits.on_stopped(chain)
        finally:
            watchdog().forget(loop.watch)
            settle(chain, counters, started, cpu_started, completed)
        if mailbox.terminal.kind == CommandKind.FATAL:
            raise PluginFailure(source_node["path"], RuntimeError(mailbox.terminal.reason))
        return counters

    def _may_close(self, commits, chain, counters, loop, reader) -> bool:
        """Whether the draining loop may end: a batch reader at the end of its input, once its
        final checkpoint is committed (``ReaderCommits.input_done``). A reader closed by a
        member drain never ends by itself: once a checkpoint at or after its first snapshot
        after the close is committed, it ships its log lines, reports the one committed
        (``gracefulClose`` in its runtime metrics, fenced by member and attempt) and answers
        barriers, reading nothing, until the master moves it. A reader whose poll had ended
        its input before the close was applied finishes as at the end of its input."""
        if not self.closing or loop.input_ended:
            return commits.input_done(chain)
        final, committed = commits.final, commits.committed
        if self.closed_at is None and final is not None and committed >= final:
            self.closed_at = committed  # ``final`` itself may have been aborted
            log.info("task group %s closed gracefully at checkpoint %s", self.group.id, committed)
            counters.roll(chain)
            tasklog_shipping.ship_now()
            self._report(counters, loop, reader)  # what the master's drain waits for
        return False

    def _abandon(self, error: str) -> None:
        """The watchdog's verdict on a poll call that did not return after its wakeup (on the
        watchdog's thread): the task group fails now and its slot is freed, with no wait for
        the call. This thread is abandoned to it; whatever it does if the call ever returns is
        fenced by its attempt (reports of an ended attempt change nothing), and the fatal
        terminal signal set here ends its loop before another step. The watchdog forgets the
        watch; what its mailbox holds is dropped, so its bytes go back to the worker's budget
        (the terminal signal refuses every later admission)."""
        thread = self.thread
        self.abandoned = True
        with attributed(thread.task_group_id, thread.attempt):
            log.error("task group %s attempt %s: %s", thread.task_group_id, thread.attempt, error)
        mailbox = self.mailbox
        if mailbox is not None:
            mailbox.signal_terminal(CommandKind.FATAL, "POLL_CANCELLATION_TIMEOUT")
            while mailbox.take() is not None:  # each releases its capacity
                pass
        thread.stop.set()
        failure = str(PluginFailure(self.source_path, PollStuck(error)))
        threading.Thread(  # the report may ride out a database outage: not on the watchdog
            target=self._report_abandoned,
            args=(failure,),
            name=f"abandoned-{thread.task_group_id}-{thread.attempt}",
            daemon=True,
        ).start()

    def _report_abandoned(self, failure: str) -> None:
        thread = self.thread
        try:
            thread.finish(ExecutionStatus.FAILED, failure, self.counters)
        finally:
            thread.runtime.forget(thread)  # a redeployment here starts a thread of its own
            connections.close_all()

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
            if self.abandoned:
                return  # failed by the watchdog meanwhile: nothing more reaches its sinks
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
            self._after_step(loop, commits)
            if not worked:
                self.wake.wait(loop.idle_for(IDLE_WAIT))

    def _after_step(self, loop: ReaderEventLoop, commits) -> None:
        """Its messages to the enumerator go out, and a completion its commits found (a
        completion control may be lost) is the event loop's too."""
        self.link.tick()
        if commits.committed > self._completed:
            self._completed = commits.committed
            loop.checkpoint_completed(commits.committed)

    def _close_report(self) -> dict:
        """A member drain's graceful close as the master reads it: asked of this attempt, and
        the checkpoint it closed at once that is committed (None until then)."""
        if not self.closing:
            return {}
        return {"gracefulClose": {"attempt": self.thread.attempt, "checkpoint": self.closed_at}}

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
                "schemaChanges": loop.schema_driver.changes,
            },
            "controlLatencyMs": metrics.control_latency.to_json(),
            "admissionLatency": self.mailbox.latency.to_json(),
            "lifecycle": loop.life.state.value,
            **self._close_report(),
            "available": loop.availability.metrics(),  # AVAILABLE wakeups, coalesced
            "sourceEvents": {"sent": self.link.events_sent},
        }
        if callable(getattr(reader, "metrics", None)):  # the connector's own counts
            extra["reader"] = reader.metrics()
        warning = self.mailbox.latency.warning(time.monotonic())
        if warning is not None:  # at most once a minute
            log.warning("task group %s: %s", self.group.id, warning)
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
