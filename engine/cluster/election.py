"""Active-master election through PostgreSQL.

Leadership is the session advisory lock ``LEADERSHIP`` held on a dedicated connection, plus the
lease row (``MasterLease``) whose epoch is the fencing token. Why both (docs/decisions/0001):

- the lock gives fast failover: when an active master dies its socket closes, PostgreSQL ends its
  session and frees the lock at once; a standby polling ``pg_try_advisory_lock`` takes it at once;
- the lease covers what the lock cannot see: a master that is frozen (SIGSTOP) or behind a
  half-open connection keeps its session and lock. Once its lease has expired by the database's
  clock, a standby ends that session (``pg_terminate_backend``, only if it really is the holder's
  lock session) and takes the lock;
- the epoch makes the old master harmless whatever it believes: every master write is fenced.

A master of a protocol older than dirty-job tracking needs does not campaign while a job that
tracks its recovery runs (engine.cluster.versions), as an older worker does not join.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.db import connection, transaction

from engine import events as builders
from engine.cluster.lease import LeaseKeeper, LeaseLost, renew_on
from engine.cluster.versions import tracking_refusal
from engine.dbsession import connect_dedicated
from engine.events import append_event
from engine.fencing import StaleEpoch, fenced
from engine.locks import LEADERSHIP
from engine.models import MasterCandidate
from engine.protocol import DIRTY_TRACKING_SINCE, PROTOCOL_VERSION
from engine.states import CandidateState

log = logging.getLogger("keel.election")


def lock_application_name(master_name: str) -> str:
    return f"keel-lock:{master_name}"


class LeadershipLost(Exception):
    """The session that held the leadership lock is gone."""


class MasterRefused(Exception):
    """This master may not lead now (it runs a protocol too old for what runs)."""


@dataclass
class Term:
    epoch: int
    since: datetime


class Leadership:
    """One master process's view of leadership: campaign, renew, resign.

    While active, the lease is renewed by a LeaseKeeper thread on the lock session; the loop
    ``beat()``s before each step and ``check()``s the renewals (engine.cluster.lease)."""

    def __init__(
        self,
        name: str,
        lease_timeout: float,
        stall_limit: float = 30.0,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        self.name = name
        self.lease_timeout = lease_timeout
        self.stall_limit = stall_limit
        self.protocol_version = protocol_version
        self.term: Term | None = None
        #: Why the last campaign was refused ("" once one is not): logged when it changes.
        self.refused = ""
        self._lock_conn: psycopg.Connection | None = None
        self._keeper: LeaseKeeper | None = None

    @property
    def active(self) -> bool:
        return self.term is not None

    @property
    def epoch(self) -> int | None:
        return self.term.epoch if self.term else None

    # -- the dedicated lock session ---------------------------------------------------------

    def _lock_session(self) -> psycopg.Connection:
        if self._lock_conn is None or self._lock_conn.closed:
            self._lock_conn = connect_dedicated(lock_application_name(self.name))
        return self._lock_conn

    def _drop_lock_session(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing lock session failed", exc_info=True)

    def _try_lock(self) -> bool:
        try:
            row = self._lock_session().execute("SELECT pg_try_advisory_lock(%s, %s)", LEADERSHIP)
            return bool(row.fetchone()[0])
        except psycopg.Error as exc:
            self._drop_lock_session()
            raise LeadershipLost(f"lock session: {exc}".strip()) from exc

    def _end_expired_holder(self) -> bool:
        """End the sessions of whoever holds the leadership lock once the lease has expired;
        True if a lock session was ended.

        The holder is found in pg_locks, not taken from the lease: it is either the lease's
        holder (its lease expired: frozen, or behind a half-open connection), or a candidate
        that took the lock and never committed its takeover (frozen in between) for at least a
        lease's time since. Only a session carrying a ``keel-lock:`` application_name is ended,
        never our own; the holder's Django sessions go too, so none of them keeps a row lock.
        """
        try:
            row = (
                self._lock_session()
                .execute(
                    """
                WITH holder AS (
                    SELECT a.pid, substr(a.application_name, 11) AS name
                      FROM engine_masterlease l
                      JOIN pg_locks k
                        ON k.locktype = 'advisory' AND k.granted
                       AND k.classid = %s AND k.objid = %s AND k.objsubid = 2
                      JOIN pg_stat_activity a
                        ON a.pid = k.pid
                       AND a.datname = current_database()
                       AND a.pid <> pg_backend_pid()
                       AND a.application_name LIKE 'keel-lock:%%'
                     WHERE l.id = 1 AND l.expires_at < clock_timestamp()
                       AND ((a.pid = l.lock_backend_pid
                             AND a.application_name = left('keel-lock:' || l.holder, 63))
                            OR a.state_change
                               < clock_timestamp() - make_interval(secs => %s))
                )
                SELECT pg_terminate_backend(h.pid, 1000),
                       (SELECT count(pg_terminate_backend(a.pid))
                          FROM pg_stat_activity a
                         WHERE a.datname = current_database()
                           AND a.application_name LIKE 'keel:' || h.name || ':%%')
                  FROM holder h
                """,
                    (*LEADERSHIP, self.lease_timeout),
                )
                .fetchone()
            )
        except psycopg.Error as exc:
            self._drop_lock_session()
            raise LeadershipLost(f"lock session: {exc}".strip()) from exc
        if row and row[0]:
            log.warning("ended the sessions of the expired leadership lock holder")
            return True
        return False

    # -- steps -------------------------------------------------------------------------------

    def campaign(self) -> bool:
        """Standby step: take leadership if it is free; True when this process became active.
        An older master refused (tracked jobs run) does not even try for the lock."""
        if self.active or self._refused_now():
            return False
        if not self._try_lock():
            if not self._end_expired_holder() or not self._try_lock():
                return False
        try:
            self.term = self._take_over()
        except MasterRefused as exc:  # a tracked job was submitted since _refused_now
            self._drop_lock_session()
            self._refuse(str(exc))
            return False
        except BaseException:
            self._drop_lock_session()  # releases the lock
            raise
        self._keeper = LeaseKeeper(
            self._lock_session(), self.term.epoch, self.name, self.lease_timeout, self.stall_limit
        )
        self.refused = ""
        log.info("%s is the active master with epoch %s", self.name, self.term.epoch)
        return True

    def _refusal(self, cur) -> str:
        return tracking_refusal(
            cur, f"master {self.name}", self.protocol_version, "campaign", "master"
        )

    def _refused_now(self) -> bool:
        if self.protocol_version >= DIRTY_TRACKING_SINCE:
            return False
        with transaction.atomic(), connection.cursor() as cur:
            message = self._refusal(cur)
        if message:
            self._refuse(message)
        return bool(message)

    def _refuse(self, message: str) -> None:
        if message != self.refused:
            log.error("campaign refused: %s", message)
        self.refused = message

    def _take_over(self) -> Term:
        lock_pid = self._lock_session().info.backend_pid
        with transaction.atomic():
            with connection.cursor() as cur:
                # The check again, under the gate, for the takeover: of this and a tracked
                # job's submission, one always sees the other.
                message = self._refusal(cur)
                if message:
                    raise MasterRefused(message)
                # Waits for fenced transactions of the previous epoch (FOR KEY SHARE) to finish;
                # a frozen one is ended by idle_in_transaction_session_timeout.
                cur.execute("SET LOCAL lock_timeout = '1000ms'")
                cur.execute("SELECT epoch FROM engine_masterlease WHERE id = 1 FOR UPDATE")
                cur.execute(
                    """
                    UPDATE engine_masterlease
                       SET epoch = epoch + 1, holder = %s, lock_backend_pid = %s,
                           since = clock_timestamp(), renewed_at = clock_timestamp(),
                           expires_at = clock_timestamp() + make_interval(secs => %s)
                     WHERE id = 1
                 RETURNING epoch, since
                    """,
                    [self.name, lock_pid, self.lease_timeout],
                )
                epoch, since = cur.fetchone()
            if self.protocol_version < DIRTY_TRACKING_SINCE:
                # Seen by a tracked job's submission from the moment this commits (the loop
                # records it only afterwards), so that submission is refused.
                record_candidate(self.name, self, state=CandidateState.ACTIVE, epoch=epoch)
            append_event(
                builders.master_elected(epoch, self.name, os.getpid(), socket.gethostname())
            )
        return Term(epoch=epoch, since=since)

    def beat(self) -> None:
        """The master loop is about to run a step (its keeper renews while it beats)."""
        if self._keeper is not None:
            self._keeper.beat()

    def check(self) -> None:
        """Raise StaleEpoch or LeadershipLost if the keeper could not renew our lease; the
        caller steps down."""
        if self._keeper is not None:
            try:
                self._keeper.check()
            except LeaseLost as exc:
                self._raise_lost(exc)

    def renew(self) -> None:
        """Extend the lease at once under our epoch, on the lock session (which proves the
        session and its lock alive). Raises StaleEpoch when another master has taken over, and
        LeadershipLost when the lock session is gone; either way the caller steps down."""
        assert self.term is not None
        conn = self._lock_conn
        try:
            if conn is None or conn.closed:
                raise LeaseLost("the leadership lock session is closed", stale=False)
            renew_on(conn, self.term.epoch, self.name, self.lease_timeout)
        except LeaseLost as exc:
            self._raise_lost(exc)
        if self._keeper is None or self._keeper.lost is not None:
            # The session survived what stopped the keeper: renew from a new one.
            self._keeper = LeaseKeeper(
                conn, self.term.epoch, self.name, self.lease_timeout, self.stall_limit
            )

    def _raise_lost(self, exc: LeaseLost) -> None:
        """StaleEpoch if another epoch leads now (a rejected write, recorded as such), else
        LeadershipLost (the lock session failed and no one has taken over, or the database
        cannot say)."""
        current = _read_epoch()
        if exc.stale or (current is not None and current != self.epoch):
            raise StaleEpoch(self.epoch, current) from exc
        raise LeadershipLost(str(exc)) from exc

    def resign(self) -> None:
        """Hand over at once (SIGTERM): expire our lease, then free the lock."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()  # no renewal after the expiry below
        if self.term is not None:
            try:
                with fenced(self.term.epoch):
                    with connection.cursor() as cur:
                        cur.execute("UPDATE engine_masterlease SET expires_at = now() WHERE id = 1")
                    append_event(builders.master_resigned(self.term.epoch, self.name))
            except Exception:
                log.warning("could not record the resignation", exc_info=True)
        self.step_down()

    def step_down(self) -> None:
        if self.term is not None:
            log.warning("%s steps down from epoch %s", self.name, self.term.epoch)
        self.term = None
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
        self._drop_lock_session()


def _read_epoch() -> int | None:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT epoch FROM engine_masterlease WHERE id = 1")
            row = cur.fetchone()
        return row[0] if row else None
    except Exception:
        return None


def record_candidate(
    name: str,
    leadership: Leadership,
    *,
    rejected_epoch: int | None = None,
    state: str | None = None,
    epoch: int | None = None,
) -> None:
    """Upsert this master's own candidate row (not a fenced write: it is the process's own);
    ``epoch``: the one it is taking over, before its term is set."""
    if state is None:
        state = CandidateState.ACTIVE if leadership.active else CandidateState.STANDBY
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO engine_mastercandidate
                   (name, pid, host, state, epoch, started_at, last_seen, fenced_rejections,
                    last_rejected_epoch, protocol_version)
            VALUES (%(name)s, %(pid)s, %(host)s, %(state)s, %(epoch)s, now(), now(),
                    %(rej)s, %(rej_epoch)s, %(protocol)s)
            ON CONFLICT (name) DO UPDATE
               SET pid = EXCLUDED.pid, host = EXCLUDED.host, state = EXCLUDED.state,
                   epoch = EXCLUDED.epoch, last_seen = now(),
                   protocol_version = EXCLUDED.protocol_version,
                   started_at = CASE WHEN engine_mastercandidate.pid = EXCLUDED.pid
                                     THEN engine_mastercandidate.started_at ELSE now() END,
                   fenced_rejections = engine_mastercandidate.fenced_rejections + %(rej)s,
                   last_rejected_epoch = COALESCE(%(rej_epoch)s,
                                                  engine_mastercandidate.last_rejected_epoch)
            """,
            {
                "name": name,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "state": state,
                "epoch": leadership.epoch if epoch is None else epoch,
                "rej": 1 if rejected_epoch is not None else 0,
                "rej_epoch": rejected_epoch,
                "protocol": leadership.protocol_version,
            },
        )


__all__ = [
    "Leadership",
    "LeadershipLost",
    "MasterCandidate",
    "MasterRefused",
    "StaleEpoch",
    "record_candidate",
]
