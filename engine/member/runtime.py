"""The member runtime: task groups deployed to this worker, each in a thread it owns.

The Celery handlers (engine.member.handlers) only validate a command and hand it here. A task
group thread reports RUNNING, runs the enumerator or the reader data plane, and reports how it
ended, always under its attempt number: if the master has moved on (new attempt, job cancelled,
member removed) the report changes nothing and the thread just stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import close_old_connections, connections

from engine.cluster.membership import MemberSession
from engine.dbsession import ride_out
from engine.jobs import checkpoints, lifecycle, splits
from engine.member import savemodes, tasklog_shipping
from engine.member.commits import ReaderCommits, for_reader
from engine.member.dataplane import Chain, Counters, PluginFailure, guarded, instantiate, run_reader
from engine.member.mailbox import Barrier, Commit, Mailbox, Message
from engine.member.managed_enumerator import ManagedEnumeratorTask
from engine.member.managed_reader import ManagedReaderTask
from engine.member.reports import GroupCommit
from engine.member.tasklogs import bind as bind_task_logs
from engine.member.tracebacks import traceback_of
from engine.models import TaskGroup
from engine.outbox import Outbox
from engine.sourceruntime import SourceRuntime
from engine.sourceruntime.choices import AdmissionStatus, CommandKind, Lane
from engine.sourceruntime.coordinator import SharedWorkerPool
from engine.sourceruntime.envelope import AdmissionAck, SourceCommandEnvelope
from engine.sourceruntime.mailbox import WorkerBudget
from engine.states import ExecutionStatus, TaskGroupKind

log = logging.getLogger("keel.runtime")
T = TypeVar("T")
SPLIT_WAIT_INTERVAL = 0.01
ENUMERATOR_TICK = 0.05
#: How often a Lane B enumerator asks the database whether its readers live and it is current.
ENUMERATOR_CHECK_INTERVAL = 0.25


class TaskGroupThread(threading.Thread):
    def __init__(self, runtime: MemberRuntime, task_group_id: int, attempt: int) -> None:
        super().__init__(name=f"taskgroup-{task_group_id}-{attempt}", daemon=True)
        self.runtime = runtime
        self.task_group_id = task_group_id
        self.attempt = attempt
        self.stop = threading.Event()
        self.mailbox = Mailbox()
        #: The newest checkpoint whose barrier this attempt handled: a barrier is re-sent until
        #: acked, and handling it twice would move the cut (checkpoint ids only grow).
        self.last_barrier = 0
        #: A Lane A task group's runtime (engine.member.managed_reader, managed_enumerator):
        #: where the handlers admit its commands. None in Lane B.
        self.managed: ManagedReaderTask | ManagedEnumeratorTask | None = None

    def first_barrier(self, message: Message) -> bool:
        """True for a barrier this attempt has not handled yet (and marks it handled)."""
        if not isinstance(message, Barrier) or message.checkpoint_id <= self.last_barrier:
            return False
        self.last_barrier = message.checkpoint_id
        return True

    @property
    def member_id(self) -> int:
        return self.runtime.member.id

    def run(self) -> None:
        # What this thread (and work it hands to the coordinator pool) logs is this attempt's:
        # engine.member.tasklogs ships it to the job page.
        bind_task_logs(self.task_group_id, self.attempt)
        counters = Counters()
        try:
            running = self.db(
                "reporting RUNNING",
                self.runtime.running_reports.commit,
                (self.task_group_id, self.attempt),
            )
            if not running:
                log.info(
                    "task group %s attempt %s is no longer ours", self.task_group_id, self.attempt
                )
                return
            group = self.db(
                "loading",
                TaskGroup.objects.select_related("pipeline", "job").get,
                id=self.task_group_id,
            )
            managed = (
                SourceRuntime.from_json(group.pipeline.plan.get("sourceRuntime")).lane
                == Lane.MANAGED
            )
            enumerator = group.kind == TaskGroupKind.ENUMERATOR
            if enumerator and not savemodes.before_first_split(self, group):
                self.stop.set()  # no longer ours: nothing assigned, nothing applied again
            elif managed and enumerator:
                self.managed = ManagedEnumeratorTask(
                    self, group, self.runtime.pool(), self.runtime.outbox
                )
                self.managed.run()
            elif managed:
                self.managed = ManagedReaderTask(self, group, self.runtime.budget)
                counters = self.managed.run()
            elif enumerator:
                self.run_enumerator(group)
            else:
                counters = self.run_reader(group)
            status = ExecutionStatus.CANCELED if self.stop.is_set() else ExecutionStatus.FINISHED
            self.finish(status, "", counters)
        except PluginFailure as exc:
            log.warning("task group %s failed: %s", self.task_group_id, exc)
            self.finish(ExecutionStatus.FAILED, str(exc), counters, traceback_of(exc))
        except Exception as exc:
            log.exception("task group %s crashed", self.task_group_id)
            error = f"{type(exc).__name__}: {exc}"
            self.finish(ExecutionStatus.FAILED, error, counters, traceback_of(exc))
        finally:
            self.runtime.forget(self)
            connections.close_all()

    def finish(self, status: str, error: str, counters: Counters, traceback: str = "") -> None:
        """Report how this attempt ended (with a failure's traceback, for the job's exception
        history), until the report is written or this member is fenced."""
        metrics = (
            counters.received,
            counters.written,
            counters.rate,
            counters.busy_seconds,
            counters.cpu_seconds,
            counters.received_bytes,
            counters.written_bytes,
            counters.blocked_seconds,
        )
        tasklog_shipping.ship_now()  # its last lines (its error's) land before it can move
        attempt = 0
        while True:  # the report is the only record of how we ended: retry while we live
            attempt += 1
            try:
                close_old_connections()
                self.runtime.finish_reports.commit(
                    (self.task_group_id, self.attempt, status, error, metrics, traceback)
                )
                return
            except Exception:
                log.warning(
                    "reporting %s for task group %s failed (try %s)",
                    status,
                    self.task_group_id,
                    attempt,
                    exc_info=attempt == 1,
                )
                connections.close_all()
                # A fenced member exits (the heartbeat thread ends the process), so this loop
                # cannot outlive our membership.
                time.sleep(min(0.2 * attempt, 5.0))

    def db(self, what: str, call: Callable[..., T], *args, **kwargs) -> T:
        """A call to the engine's database that rides out an outage (reconnecting, for up to
        ``engine.database-outage-tolerance``) instead of failing the task group."""
        return ride_out(
            lambda: call(*args, **kwargs),
            f"task group {self.task_group_id} {what}",
            wait=self.stop.wait,
        )

    def still_current(self) -> bool:
        return self.db(
            "checking its attempt", lifecycle.owns, self.task_group_id, self.attempt, self.member_id
        )

    def run_enumerator(self, group: TaskGroup) -> None:
        pipeline, job = group.pipeline, group.job
        if not pipeline.splits_assigned:
            source = instantiate(pipeline.plan["source"])
            try:
                created = source.create_splits(job.mode)
            except Exception as exc:
                raise PluginFailure(pipeline.plan["source"]["path"], exc) from exc
            assigned = self.db(
                "assigning splits",
                splits.assign,
                pipeline.id,
                created,
                pipeline.plan.get("parallelism", job.env["parallelism"]),
                lambda: lifecycle.owns(self.task_group_id, self.attempt, self.member_id),
            )
            if not assigned:
                return

        def handle(message: Message) -> None:
            if self.first_barrier(message):  # the enumerator's state lives in split assignments
                self.db(
                    "acknowledging a barrier",
                    checkpoints.acknowledge,
                    message.checkpoint_id,
                    self.task_group_id,
                    self.attempt,
                    {"kind": "enumerator"},
                )

        # The enumerator holds its slot for the pipeline's life, as in Zeta. Its mailbox is
        # drained every tick; the database is asked less often (a cancel sets ``stop`` at once).
        checked = time.monotonic()
        watch = self.runtime.enumerators
        watch.add(self.task_group_id, self.attempt, pipeline.id)
        try:
            while not self.stop.wait(ENUMERATOR_TICK):
                self.mailbox.drain(handle)
                if time.monotonic() - checked < ENUMERATOR_CHECK_INTERVAL:
                    continue
                checked = time.monotonic()
                current, readers_live = self.db("checking its attempt", watch.check, self)
                if not readers_live:
                    return
                if not current:
                    self.stop.set()
                    return
        finally:
            watch.discard(self.task_group_id, self.attempt)

    def run_reader(self, group: TaskGroup) -> Counters:
        pipeline = group.pipeline
        while not self.db("waiting for splits", splits.assigned, pipeline.id):
            if self.stop.wait(SPLIT_WAIT_INTERVAL):
                return Counters()
            if not self.still_current():
                self.stop.set()
                return Counters()
        reader = splits.Reader(self.task_group_id, self.attempt, self.member_id)
        restored = getattr(
            self.db("finding its checkpoint", checkpoints.latest_completed, pipeline.id), "id", None
        )
        commits, context = for_reader(self, group, restored)

        def progress(counters: Counters, offsets: dict) -> None:
            owned = self.db(
                "reporting progress",
                splits.record_progress,
                reader,
                pipeline.id,
                counters.received,
                counters.written,
                counters.rate,
                offsets,
                received_bytes=counters.received_bytes,
                written_bytes=counters.written_bytes,
                busy_seconds=counters.busy_seconds,
                blocked_seconds=counters.blocked_seconds,
            )
            if not owned:
                self.stop.set()  # the master moved on: stop at once

        def split_done(split_id: str, offset: int) -> None:
            if not self.db(
                "ending a split", splits.mark_done, reader, pipeline.id, split_id, offset
            ):
                self.stop.set()  # not ours any more

        def boundary(positions: dict, chain: Chain) -> None:
            self.mailbox.drain(
                lambda message: self.handle_at_boundary(message, positions, chain, commits)
            )
            commits.apply(chain)

        return run_reader(
            pipeline.plan,
            splits.unread(pipeline.id, group.index),
            group.job.mode,
            context,
            self.stop,
            progress,
            split_done,
            boundary,
            commits.input_done,
            commits.on_stopped,
        )

    def handle_at_boundary(
        self, message: Message, positions: dict, chain: Chain, commits: ReaderCommits
    ) -> None:
        """A reader's barrier or commit, between two batches."""
        if self.first_barrier(message):
            sinks = [
                guarded(path, writer.prepare_commit, message.checkpoint_id)
                for path, _, writer in chain.sinks
            ]
            if commits.acknowledge(message.checkpoint_id, {"splits": positions, "sinks": sinks}):
                commits.on_barrier(message.checkpoint_id, positions)
        elif isinstance(message, Commit):
            commits.apply(chain, now=True)


class EnumeratorWatch:
    """What every Lane B enumerator of this member asks the database every
    ``ENUMERATOR_CHECK_INTERVAL`` (is its attempt still current, does a reader of its pipeline
    live), asked for all of them in one statement by whichever asks first after the interval:
    the member's idle enumerators cost one query an interval, not two each."""

    def __init__(self, member_id: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.member_id = member_id
        self.clock = clock
        self._lock = threading.Lock()  # the registrations and the last answers
        self._refresh = threading.Lock()  # one statement at a time
        self._watched: dict[tuple[int, int], int] = {}  # (task group, attempt) -> pipeline
        self._answers: dict[tuple[int, int], tuple[bool, bool]] = {}
        self._asked: dict[tuple[int, int], float] = {}  # when each was last in an answer

    def add(self, task_group_id: int, attempt: int, pipeline_id: int) -> None:
        with self._lock:
            self._watched[(task_group_id, attempt)] = pipeline_id

    def discard(self, task_group_id: int, attempt: int) -> None:
        with self._lock:
            self._watched.pop((task_group_id, attempt), None)
            self._asked.pop((task_group_id, attempt), None)

    def check(self, thread: TaskGroupThread) -> tuple[bool, bool]:
        """(current, readers live) for ``thread``, from an answer no older than half the check
        interval, or a new one for every enumerator watched. While another thread asks, the
        last answer stands (never a wait: the enumerator's mailbox is drained meanwhile)."""
        key = (thread.task_group_id, thread.attempt)
        with self._lock:
            last = self._answers.get(key)
            if last is not None and self._asked.get(key, float("-inf")) > self.clock() - (
                ENUMERATOR_CHECK_INTERVAL / 2
            ):
                return last
        if not self._refresh.acquire(blocking=False):
            return last or (True, True)  # being asked now: the next check reads the answer
        try:
            with self._lock:
                watched = [(tg, at, pipeline) for (tg, at), pipeline in self._watched.items()]
            started = self.clock()
            answers = lifecycle.enumerators_checked(self.member_id, watched)
            with self._lock:
                self._answers = answers
                for tg, at, _ in watched:
                    if (tg, at) in self._watched:  # not one that ended meanwhile
                        self._asked[(tg, at)] = started
                return answers.get(key, (True, True))  # not asked: the next check asks
        finally:
            self._refresh.release()


class MemberRuntime:
    """Task groups running in this member, by (task group id, attempt)."""

    def __init__(self, member: MemberSession) -> None:
        self.member = member
        self._lock = threading.Lock()
        self._threads: dict[int, TaskGroupThread] = {}
        #: Lane A: payload bytes queued in every reader mailbox of this worker, the commands
        #: its enumerators and readers send (and answer), and the coordinators' async workers.
        self.budget = WorkerBudget(settings.ENGINE["source-runtime.worker-mailbox.max-bytes"])
        self.outbox = Outbox()
        self.enumerators = EnumeratorWatch(member.id)
        #: RUNNING reports of task groups starting together, and the reports of task groups
        #: ending together, each written in one transaction (engine.member.reports).
        self.running_reports: GroupCommit[tuple[int, int], bool] = GroupCommit(
            lambda keys: lifecycle.mark_running_many(member.id, keys), default=False
        )
        self.finish_reports: GroupCommit[lifecycle.Ended, bool] = GroupCommit(
            lambda endings: lifecycle.finish_task_groups(member.id, endings), default=False
        )
        self._pool: SharedWorkerPool | None = None

    def pool(self) -> SharedWorkerPool:
        with self._lock:
            if self._pool is None:
                workers = settings.ENGINE["source-runtime.coordinator.async-max-concurrency"]
                self._pool = SharedWorkerPool(workers)
            return self._pool

    def _thread(self, task_group_id: int) -> TaskGroupThread | None:
        with self._lock:
            return self._threads.get(task_group_id)

    def admit(
        self, task_group_id: int, attempt: int, envelope: SourceCommandEnvelope
    ) -> AdmissionAck:
        """An enumerator's command for a Lane A reader here: admitted (or refused) at once."""
        thread = self._thread(task_group_id)
        if thread is not None and thread.attempt > attempt:
            return AdmissionAck(AdmissionStatus.STALE_TARGET, attempt, reasonCode="STALE_ATTEMPT")
        managed = thread.managed if thread is not None and thread.attempt == attempt else None
        if not isinstance(managed, ManagedReaderTask):  # not (yet) running here
            return AdmissionAck(
                AdmissionStatus.RETRY_LATER, attempt, retryAfterMillis=100, reasonCode="NOT_RUNNING"
            )
        return managed.admit(envelope)

    def source_ack(self, task_group_id: int, attempt: int, answer: dict) -> bool:
        """A reader's admission answer for a Lane A enumerator here."""
        thread = self._thread(task_group_id)
        managed = thread.managed if thread is not None and thread.attempt == attempt else None
        if not isinstance(managed, ManagedEnumeratorTask):
            return False
        managed.post_ack(answer)
        return True

    def close_gracefully(self, task_group_id: int, attempt: int) -> bool:
        """A member drain's graceful close for a Lane A reader attempt here (False: none)."""
        thread = self._thread(task_group_id)
        managed = thread.managed if thread is not None and thread.attempt == attempt else None
        return isinstance(managed, ManagedReaderTask) and managed.close_gracefully()

    def deploy(self, task_group_id: int, attempt: int) -> str:
        """Start the task group unless this attempt already runs here (idempotent)."""
        with self._lock:
            current = self._threads.get(task_group_id)
            if current is not None:
                if current.attempt == attempt:
                    return "already-running"
                current.stop.set()  # an older attempt: fenced, stop it
            thread = TaskGroupThread(self, task_group_id, attempt)
            self._threads[task_group_id] = thread
            thread.start()
            return "started"

    def offer(self, task_group_id: int, attempt: int, message: Message) -> bool:
        """Put an ordered command in the task group's mailbox (False: not here, or full; a
        barrier not taken fails by timeout and the next one starts fresh)."""
        with self._lock:
            thread = self._threads.get(task_group_id)
        if thread is None or thread.attempt != attempt:
            return False
        if isinstance(thread.managed, ManagedReaderTask):
            return thread.managed.offer(message)  # an ordered control in the reader mailbox
        return thread.mailbox.offer(message)

    def cancel(self, task_group_id: int, attempt: int) -> str:
        with self._lock:
            thread = self._threads.get(task_group_id)
        if thread is not None and thread.attempt <= attempt:
            thread.stop.set()
            if isinstance(thread.managed, ManagedReaderTask):
                thread.managed.terminate(CommandKind.CANCEL, "CANCEL")  # preempts, wakes it
            return "stopping"
        # Not running here: it never started (or already ended). Settle it as cancelled.
        lifecycle.finish_task_group(
            task_group_id, attempt, self.member.id, ExecutionStatus.CANCELED
        )
        return "not-running"

    def forget(self, thread: TaskGroupThread) -> None:
        with self._lock:
            if self._threads.get(thread.task_group_id) is thread:
                del self._threads[thread.task_group_id]

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return [(t.task_group_id, t.attempt) for t in self._threads.values()]

    def stop_all(self) -> None:
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.stop.set()
        for thread in threads:
            thread.join(timeout=10)


_runtime: MemberRuntime | None = None


def install(member: MemberSession) -> MemberRuntime:
    """This process is ``member`` from now on: commands addressed to it run here."""
    global _runtime
    _runtime = MemberRuntime(member)
    return _runtime


def current() -> MemberRuntime | None:
    """The runtime of the member this process is (None outside a worker process)."""
    return _runtime


def addressed(member_uuid: str) -> MemberRuntime | None:
    """The runtime, if this process is the member a command is addressed to."""
    runtime = _runtime
    if runtime is None or str(runtime.member.uuid) != member_uuid:
        return None
    return runtime
