"""The master process: a loop of step functions, each returning whether it did work.

A standby campaigns every 100 ms. The active master renews its lease and sweeps membership on
timers; it sleeps only when a pass did nothing. SIGTERM hands leadership over at once. Any write
rejected by the epoch check, or a lost lock session, makes it step down to standby.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from engine import dirty, retention
from engine.cluster.election import Leadership, LeadershipLost, record_candidate
from engine.cluster.membership import SWEEP_INTERVAL, sweep_members
from engine.dbsession import session_lost
from engine.fencing import StaleEpoch, fenced
from engine.jobs import throughput
from engine.master import control, orchestration
from engine.states import CandidateState

log = logging.getLogger("keel.master")


@dataclass
class MasterOptions:
    name: str
    heartbeat_timeout: float = 5.0
    lease_timeout: float = 3.0
    campaign_interval: float = 0.1
    candidate_interval: float = 1.0
    #: A loop that has not begun a step for this long stops renewing the lease (it is wedged).
    stall_limit: float = 30.0

    @property
    def renew_interval(self) -> float:
        return max(self.lease_timeout / 6, 0.05)


class Timer:
    """A housekeeping timer inside the loop: ``due()`` is true once per interval."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next_at = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now >= self.next_at:
            self.next_at = now + self.interval
            return True
        return False

    def reset(self) -> None:
        self.next_at = 0.0


#: How often the active master looks for overdue cleanup records (a record is executed within
#: about this long after it is due, whatever happened to its countdown).
CLEANUP_SWEEP_INTERVAL = 1.0
#: How often running jobs' throughput is sampled (the dashboard's sparklines).
THROUGHPUT_SAMPLE_INTERVAL = 5.0


#: After a pass in which a recovery step did work, no new checkpoint is triggered for this long.
RECOVERY_QUIET = 1.0
#: Checkpoints are never held back longer than this (a cluster that recovers all the time still
#: checkpoints this often).
TRIGGER_DEFERRAL_LIMIT = 5.0


class RecoveryFirst:
    """Holds new checkpoints back while a recovery is under way: under a hundred jobs, their
    barriers, acks and endings cost the machine more than the restores, and every restore waited
    behind them. Checkpoints in flight still end and commit; a job's interval is a least spacing,
    and it stretches by at most TRIGGER_DEFERRAL_LIMIT."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.busy_until = 0.0
        self.held_since: float | None = None

    def recovered_something(self) -> None:
        self.busy_until = self.clock() + RECOVERY_QUIET

    def may_trigger(self) -> bool:
        now = self.clock()
        if now >= self.busy_until:
            self.held_since = None
            return True
        if self.held_since is None:
            self.held_since = now
        if now - self.held_since >= TRIGGER_DEFERRAL_LIMIT:
            self.held_since = now  # one round now, then held again
            return True
        return False


class ActiveStep:
    """A step of the active master, run at most once per ``interval``: ``run(epoch)`` says
    whether it did work. ``after_reconcile``: only once this epoch's reconciliation is done.
    ``again_at_once``: when it did work, run it again on the next pass (more may be waiting).
    ``deferred``: its first run in a term is one interval after the takeover (not urgent, and
    the takeover's own passes go to recovery). ``recovery``: when it did work, new checkpoints
    wait (RecoveryFirst)."""

    def __init__(
        self,
        interval: float,
        run: Callable[[int], bool],
        *,
        after_reconcile: bool = False,
        again_at_once: bool = False,
        deferred: bool = False,
        recovery: bool = False,
    ) -> None:
        self.timer = Timer(interval)
        self.run = run
        self.after_reconcile = after_reconcile
        self.again_at_once = again_at_once
        self.deferred = deferred
        self.recovery = recovery

    def start_term(self) -> None:
        """A new term begins: run at once, or one interval from now if ``deferred``."""
        self.timer.next_at = time.monotonic() + self.timer.interval if self.deferred else 0.0


class Master:
    def __init__(self, options: MasterOptions) -> None:
        self.options = options
        self.leadership = Leadership(options.name, options.lease_timeout, options.stall_limit)
        self.stopping = threading.Event()
        self.campaign_timer = Timer(options.campaign_interval)
        self.renew_timer = Timer(options.renew_interval)
        self.candidate_timer = Timer(options.candidate_interval)
        self.cancels = orchestration.CancelSender()
        self.recovery_first = RecoveryFirst()
        #: The epoch whose reconciliation is done: nothing is restored or scheduled before.
        self.reconciled_epoch: int | None = None
        self.sweep = ActiveStep(SWEEP_INTERVAL, self.sweep_members)
        #: No member is judged before this (monotonic): members lost the database when we did.
        self.sweep_after = 0.0
        #: The database was lost since the last sweep: the grace starts once we are back.
        self.outage = False
        #: The active master's steps after the reconciliation, in the order of a pass.
        self.active_steps = (
            # Recovery first: lost work failed, stopping work cancelled, restores and new jobs
            # placed; then the rest, so that a busy pass never delays a restore behind it.
            ActiveStep(0.2, orchestration.fail_lost_task_groups, recovery=True),
            ActiveStep(0.2, self.cancels.step),
            ActiveStep(0.1, self.enqueue_due_steps, after_reconcile=True),
            ActiveStep(
                0.1,
                orchestration.schedule,
                after_reconcile=True,
                again_at_once=True,
                recovery=True,
            ),
            ActiveStep(0.2, orchestration.drain_members, after_reconcile=True),
            ActiveStep(
                CLEANUP_SWEEP_INTERVAL,
                control.enqueue_due_cleanups,
                after_reconcile=True,
                again_at_once=True,
            ),
            ActiveStep(0.1, self.coordinate_checkpoints),
            ActiveStep(1.0, orchestration.redeliver),
            # Housekeeping reconciles again: the takeover has just done so, so not at once.
            ActiveStep(2.0, self.housekeeping, after_reconcile=True, deferred=True),
            ActiveStep(
                10.0, retention.sweep, after_reconcile=True, again_at_once=True, deferred=True
            ),
            ActiveStep(THROUGHPUT_SAMPLE_INTERVAL, throughput.sample, after_reconcile=True),
        )
        #: One pass of the loop, in order (built once: the loop runs every 20 ms when idle).
        self.steps = (
            self.step_campaign,
            self.step_renew,
            partial(self.run_active, self.sweep),
            self.step_reconcile,
            *(partial(self.run_active, step) for step in self.active_steps),
            self.step_candidate,
        )

    def step_campaign(self) -> bool:
        if self.leadership.active or not self.campaign_timer.due():
            return False
        if self.leadership.campaign():
            self.renew_timer.reset()
            self.sweep.timer.reset()
            for step in self.active_steps:
                step.start_term()
            record_candidate(self.options.name, self.leadership)
            return True
        return False

    def step_renew(self) -> bool:
        """The lease is renewed by its keeper thread; here the loop learns if it failed."""
        if not self.leadership.active or not self.renew_timer.due():
            return False
        self.leadership.check()
        return False

    def step_reconcile(self) -> bool:
        """Once per epoch, before restores are enqueued or jobs scheduled: settle what a
        previous master left (engine.master.orchestration.reconcile)."""
        epoch = self.leadership.epoch
        if not self.leadership.active or self.reconciled_epoch == epoch:
            return False
        changed = orchestration.reconcile(epoch)
        self.reconciled_epoch = epoch
        if changed:
            log.info("dirty-job reconciliation under epoch %s changed %s attempts", epoch, changed)
        return True

    def step_candidate(self) -> bool:
        if self.candidate_timer.due():
            record_candidate(self.options.name, self.leadership)
        return False

    def run_active(self, step: ActiveStep) -> bool:
        if not self.leadership.active:
            return False
        if step.after_reconcile and self.reconciled_epoch != self.leadership.epoch:
            return False
        if not step.timer.due():
            return False
        did = step.run(self.leadership.epoch)
        if did and step.again_at_once:
            step.timer.reset()
        if did and step.recovery:
            self.recovery_first.recovered_something()
        return did

    def enqueue_due_steps(self, epoch: int) -> bool:
        # A restore still waiting for slots moves no recovery: it holds no checkpoint back.
        return control.enqueue_due_steps(epoch, self.recovery_first.recovered_something)

    def coordinate_checkpoints(self, epoch: int) -> bool:
        return orchestration.coordinate_checkpoints(
            epoch, trigger=self.recovery_first.may_trigger()
        )

    def sweep_members(self, epoch: int) -> bool:
        if self.outage:  # back (this pass's writes got through): the grace starts now
            self.outage = False
            self.sweep_after = time.monotonic() + self.options.heartbeat_timeout
        if time.monotonic() < self.sweep_after:
            return False
        return sweep_members(epoch, self.options.heartbeat_timeout) > 0

    def housekeeping(self, epoch: int) -> bool:
        """Reconcile again (repairs what a contained failure left) and expire stale recovery
        episodes. Only what has been left alone for engine.housekeeping.settle: a recovery in
        flight is the normal path's to finish."""
        changed = orchestration.reconcile(epoch, float(settings.ENGINE["housekeeping.settle"]))
        return dirty.expire_stale_episodes(epoch) or changed > 0

    def run_once(self) -> bool:
        """One pass of every step; True if any did work (the loop then goes on at once)."""
        did = False
        for step in self.steps:
            self.leadership.beat()
            did = step() or did
        return did

    def run(self) -> None:
        log.info(
            "master %s started (lease %.1fs, heartbeat timeout %.1fs)",
            self.options.name,
            self.options.lease_timeout,
            self.options.heartbeat_timeout,
        )
        try:
            while not self.stopping.is_set():
                try:
                    did = self.run_once()
                except StaleEpoch as exc:
                    self._rejected(exc)
                    continue
                except (
                    LeadershipLost,
                    DatabaseError,
                    InterfaceError,
                    psycopg.Error,
                    OSError,
                ) as exc:
                    self._lost_database(exc)
                    continue
                except Exception:
                    # A bug in a step must not take the master down, nor let it act unsure.
                    log.exception("unexpected error in the master loop; stepping down")
                    self.leadership.step_down()
                    self.stopping.wait(1.0)
                    continue
                if not did:
                    self.stopping.wait(0.02 if self.leadership.active else 0.05)
        finally:
            self.shutdown()

    def _rejected(self, exc: StaleEpoch) -> None:
        log.error("write rejected by the epoch check: %s; %s steps down", exc, self.options.name)
        self.leadership.step_down()
        try:
            record_candidate(self.options.name, self.leadership, rejected_epoch=exc.mine)
        except (DatabaseError, InterfaceError):
            log.warning("could not record the rejection", exc_info=True)

    def _lost_database(self, exc: BaseException) -> None:
        log.error("database error in master loop: %s", str(exc).strip() or type(exc).__name__)
        # Whatever cut us off (a restart, a failover to a standby however slow its promotion,
        # a partition) cut the members off too: they get one heartbeat timeout from our
        # return to take their locks back and beat again before any is judged dead. An error
        # that is not an outage (a constraint, a timeout) holds no sweep back.
        if isinstance(exc, LeadershipLost) or session_lost(exc):
            self.outage = True
        try:
            for conn in connections.all():
                conn.close_if_unusable_or_obsolete()
            close_old_connections()
        except Exception:
            log.debug("closing connections failed", exc_info=True)
        if self.leadership.active:
            # Our session may have been ended while we were frozen. Try one write under our
            # epoch: if someone else leads now it is rejected by the epoch check (and recorded).
            try:
                connections["default"].close()
                self.leadership.renew()
                with fenced(self.leadership.epoch):  # and the loop's own connection works
                    pass
                return
            except StaleEpoch as stale:
                self._rejected(stale)
                return
            except Exception:
                log.warning("cannot confirm leadership; stepping down", exc_info=True)
                self.leadership.step_down()
        self.stopping.wait(0.5)

    def shutdown(self) -> None:
        log.info("master %s stopping", self.options.name)
        try:
            self.leadership.resign()
            record_candidate(self.options.name, self.leadership, state=CandidateState.STOPPED)
        except Exception:
            log.warning("could not record the stop", exc_info=True)

    def install_signal_handlers(self) -> None:
        def handle(signum, frame):
            self.stopping.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
