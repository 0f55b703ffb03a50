"""The worker process: an engine member hosting slots, plus a Celery worker for its commands.

The member registers (fresh UUID), heartbeats on its membership session from a thread of its own,
and consumes ``member.<name>`` (commands to this member) and ``control`` (durable control steps)
with a threads-pool Celery worker. If the cluster removed it (or its membership session ended),
the heartbeat thread ends the whole process: a removed member never resumes its old identity.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass

from celery import current_app

from engine.cluster.membership import (
    MemberDrained,
    MemberFenced,
    MemberSession,
    leave,
    register_member,
)
from engine.dbsession import outage_tolerance
from engine.member import runtime
from engine.protocol import CONTROL_QUEUE, member_queue
from engine.states import SlotMode

log = logging.getLogger("keel.worker")

#: Exit status of a worker that learned it was removed from the cluster.
EXIT_FENCED = 3


@dataclass
class WorkerOptions:
    name: str
    slots: int = 8
    slot_mode: str = SlotMode.FIXED
    heartbeat_interval: float = 1.0
    concurrency: int = 4


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.member: MemberSession | None = None
        self.stopping = threading.Event()

    def register(self) -> MemberSession:
        self.member = register_member(self.options.name, self.options.slots, self.options.slot_mode)
        runtime.install(self.member)
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
            worker = current_app.Worker(
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
            # Everything loaded so far lives as long as the process: keep it out of the cyclic
            # GC, whose full collections would otherwise walk the whole Django/Celery heap
            # again and again while the data plane allocates rows.
            gc.freeze()
            # Rows are short-lived tuples of scalars: collect the young generation less often.
            gc.set_threshold(50_000, 20, 100)
            worker.start()
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
                    self.member.close()
        return (worker.exitcode if worker is not None else 0) or 0


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(0)
