"""The worker process: an engine member hosting slots, plus a Celery worker for its commands.

The member registers (fresh UUID), heartbeats on its membership session from a thread of its own,
and consumes ``member.<name>`` (commands to this member) and ``control`` (durable control steps)
with a threads-pool Celery worker. If the cluster removed it (or its membership session ended),
the heartbeat thread ends the whole process: a removed member never resumes its old identity.

The Celery worker is supervised: if it stops on an error of its own (kombu has been seen to
crash while reconnecting to a broker that came back), a new one starts in its place. The member,
its slots and its running task groups carry on; only a signal or a fenced member ends the process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from celery import current_app, signals
from celery.platforms import EX_FAILURE
from celery.worker import state as celery_state

from engine.cluster.membership import (
    MemberDrained,
    MemberFenced,
    MemberSession,
    leave,
    register_member,
)
from engine.dbsession import outage_tolerance
from engine.member import runtime, tasklog_shipping
from engine.member.gctuning import tune_for_rows
from engine.protocol import CONTROL_QUEUE, member_queue
from engine.states import SlotMode

log = logging.getLogger("keel.worker")

#: Exit status of a worker that learned it was removed from the cluster.
EXIT_FENCED = 3

#: Pause before replacing a crashed Celery worker, doubled on each crash in a row up to the cap;
#: a Celery worker that served for ``STEADY_AFTER`` seconds resets it.
RESTART_BACKOFF = (0.5, 5.0)
STEADY_AFTER = 10.0


@dataclass
class WorkerOptions:
    name: str
    slots: int = 8
    slot_mode: str = SlotMode.FIXED
    heartbeat_interval: float = 1.0
    concurrency: int = 4
    #: ``{key: value}`` tags a job's ``tag_filter`` matches (``--tag key=value``).
    tags: dict[str, str] = field(default_factory=dict)


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.member: MemberSession | None = None
        self.stopping = threading.Event()

    def register(self) -> MemberSession:
        self.member = register_member(
            self.options.name, self.options.slots, self.options.slot_mode, tags=self.options.tags
        )
        runtime.install(self.member)
        tasklog_shipping.install(self.member.id)
        return self.member

    def heartbeat_loop(self) -> None:
        assert self.member is not None
        tolerance = outage_tolerance()
        while not self.stopping.wait(self.options.heartbeat_interval):
            try:
                self.member.heartbeat(tolerance)
            except Exception as exc:  # fenced, or a failure no heartbeat can outlive
                if self.stopping.is_set():
                    return
                if isinstance(exc, MemberDrained):
                    log.warning("%s; this process exits", exc)
                    logging.shutdown()
                    sys.stderr.flush()
                    os._exit(0)
                if not isinstance(exc, MemberFenced):
                    log.exception("the member heartbeat failed")
                log.error("%s; this process exits (a restarted worker joins as a new member)", exc)
                logging.shutdown()
                sys.stderr.flush()
                os._exit(EXIT_FENCED)

    def celery_worker(self):
        # Celery keeps the logging Django configured (it would set the root logger to the
        # worker's WARNING): task groups' INFO lines, Console's rows among them, reach the
        # worker's log and the job page (engine.member.tasklogs).
        signals.setup_logging.connect(_keep_logging, weak=False, dispatch_uid="keel-worker-logging")
        return current_app.Worker(
            hostname=f"{self.options.name}@%h",
            queues=[member_queue(self.options.name), CONTROL_QUEUE],
            pool="threads",
            concurrency=self.options.concurrency,
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
            loglevel="WARNING",
            quiet=True,
        )

    def serve_commands(self):
        """Run Celery workers for this member's commands until one stops for a reason of the
        process (a signal, a fenced member); return that one."""
        backoff = RESTART_BACKOFF[0]
        while True:
            worker = self.celery_worker()
            started = time.monotonic()
            worker.start()
            if not self._crashed(worker):
                return worker
            if time.monotonic() - started >= STEADY_AFTER:
                backoff = RESTART_BACKOFF[0]
            log.error(
                "the Celery worker of member %s stopped on an error (logged above); "
                "a new one starts in %.1f s, the member and its task groups carry on",
                self.options.name,
                backoff,
            )
            if self.stopping.wait(backoff):
                return worker
            backoff = min(backoff * 2, RESTART_BACKOFF[1])

    def _crashed(self, worker) -> bool:
        """Celery ends ``start()`` with EX_FAILURE on an unrecoverable error; a shutdown asked
        for by a signal sets its state's stop flags first."""
        return (
            worker.exitcode == EX_FAILURE
            and celery_state.should_stop is None
            and celery_state.should_terminate is None
            and not self.stopping.is_set()
        )

    def run(self) -> int:
        # Until Celery installs its own handlers, SIGTERM must still end in a clean leave.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        worker = None
        try:
            self.register()
            beat = threading.Thread(
                target=self.heartbeat_loop, name="member-heartbeat", daemon=True
            )
            beat.start()
            tune_for_rows()
            worker = self.serve_commands()
        finally:
            self.stopping.set()
            if self.member is not None:
                try:
                    # LEFT first: from then on reports of our task groups are no-ops, and the
                    # master treats them as lost with this member.
                    if leave(self.member.id):
                        log.info("member %s (%s) LEFT", self.member.name, self.member.uuid)
                finally:
                    here = runtime.current()
                    if here is not None:
                        here.stop_all()
                    tasklog_shipping.shutdown()  # the last lines, while the member row is ours
                    self.member.close()
        return (worker.exitcode if worker is not None else 0) or 0


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(0)


def _keep_logging(**kwargs) -> None:
    """Celery's setup_logging signal: a receiver means Celery configures no logging."""
