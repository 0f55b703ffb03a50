"""Cluster membership: members join, heartbeat, leave; the active master removes dead ones.

A member's liveness has two signals (docs/decisions/0003-member-liveness.md):
- its membership session holds the advisory lock ``(MEMBER_NAMESPACE, member.id)``. A crashed
  worker's socket closes, PostgreSQL ends the session and the lock disappears at once, so a
  kill -9 is seen on the master's next sweep (every 200 ms), not after the heartbeat timeout;
- the heartbeat, written every ``engine.heartbeat-interval`` on that same session, covers what the
  lock cannot see: a frozen process (SIGSTOP) or a half-open connection keeps its session.
Every removal or leave increments the global member-event sequence exactly once: the state change
is a conditional update whose row count is checked, in the transaction that bumps the sequence.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid as uuidlib
from dataclasses import dataclass

import psycopg
from django.db import connection, transaction

from engine import dirty
from engine import events as builders
from engine.cluster.incarnation import SERVER_SINCE
from engine.cluster.slots import create_fixed_slots
from engine.cluster.versions import tracking_refusal, writer_refusal
from engine.connectors.jdbc_sessions import member_sink_sessions
from engine.dbsession import connect_dedicated, django_application_name
from engine.fencing import fenced
from engine.locks import EVENT_APPEND, MEMBER_NAMESPACE, member_lock_key
from engine.models import Member
from engine.protocol import PROTOCOL_VERSION
from engine.states import (
    MEMBER_TRANSITIONS,
    DrainState,
    LeaveClassification,
    MemberState,
    SlotMode,
    check_transition,
)

log = logging.getLogger("keel.membership")

#: How often the active master looks for dead members (lock gone or heartbeat too old).
SWEEP_INTERVAL = 0.2


def member_application_name(member_uuid: uuidlib.UUID | str) -> str:
    return f"keel-member:{member_uuid}"


class MemberFenced(Exception):
    """This member was removed by the cluster (or its session ended): it must exit."""


class MemberRefused(Exception):
    """The cluster does not let this member join (it runs a protocol too old for what runs)."""


class MemberDrained(MemberFenced):
    """An operator drained this member and the master verified it empty: it left the cluster
    as planned, and its process ends normally."""


@dataclass
class MemberSession:
    """A registered member and its dedicated membership session (which holds its lock)."""

    id: int
    uuid: uuidlib.UUID
    name: str
    conn: psycopg.Connection

    def heartbeat(self, outage_tolerance: float = 0.0) -> None:
        """Record a heartbeat; raise MemberFenced if the cluster no longer knows us as ALIVE.

        If the membership session is lost (a database restart or blip), reconnect for up to
        ``outage_tolerance`` seconds: the member carries on under its identity only if it can
        take its lock again and its row is still ALIVE (the master gives members that long
        after a restart, engine.cluster.membership.find_dead_members)."""
        try:
            cur = self.conn.execute(
                "UPDATE engine_member SET last_heartbeat = now() WHERE id = %s AND state = %s",
                (self.id, MemberState.ALIVE),
            )
        except psycopg.Error as exc:
            if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                raise MemberFenced(f"membership session lost: {exc}".strip()) from exc
            self._rejoin(exc, outage_tolerance)
            return
        if cur.rowcount != 1:
            raise self._gone(self.conn)

    def _gone(self, conn: psycopg.Connection) -> MemberFenced:
        """Why the cluster no longer knows us as ALIVE: drained (a planned leave), or not."""
        try:
            drained = conn.execute(
                "SELECT 1 FROM engine_memberdrain WHERE member_id = %s AND state = %s",
                (self.id, DrainState.LEFT),
            ).fetchone()
        except psycopg.Error:
            drained = None
        if drained:
            return MemberDrained(f"member {self.uuid} was drained and left the cluster")
        return MemberFenced(f"member {self.uuid} is no longer ALIVE in the cluster")

    def _rejoin(self, lost: BaseException, tolerance: float) -> None:
        """Open a new membership session holding our lock, or raise MemberFenced."""
        deadline = time.monotonic() + tolerance
        delay = 0.1
        self.close()
        log.warning("membership session of %s lost (%s); reconnecting", self.name, lost)
        while True:
            try:
                conn = connect_dedicated(member_application_name(self.uuid))
            except psycopg.Error as exc:
                if time.monotonic() + delay > deadline:
                    raise MemberFenced(f"membership session lost: {lost}".strip()) from exc
                time.sleep(delay)  # a backoff between connection attempts
                delay = min(delay * 2, 1.0)
                continue
            try:
                locked = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", member_lock_key(self.id)
                ).fetchone()[0]
                cur = conn.execute(
                    "UPDATE engine_member SET last_heartbeat = now() WHERE id = %s AND state = %s",
                    (self.id, MemberState.ALIVE),
                )
            except psycopg.Error as exc:  # the new session was lost too: try again
                conn.close()
                if time.monotonic() + delay > deadline:
                    raise MemberFenced(f"membership session lost: {exc}".strip()) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if locked and cur.rowcount == 1:
                self.conn = conn
                log.warning("member %s rejoined after a database outage", self.name)
                return
            if cur.rowcount != 1:
                gone = self._gone(conn)
                conn.close()
                raise gone
            conn.close()
            if time.monotonic() + delay > deadline:
                raise MemberFenced(f"membership session lost: {lost}; could not take it back")
            time.sleep(delay)  # our old session still holds the lock: the server ends it
            delay = min(delay * 2, 1.0)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            log.debug("closing membership session failed", exc_info=True)


def register_member(
    name: str,
    slots: int,
    slot_mode: str,
    address: str | None = None,
    protocol_version: int = PROTOCOL_VERSION,
    tags: dict[str, str] | None = None,
) -> MemberSession:
    """Register a new member (fresh UUID) with its slots and tags, holding its lock from the
    first instant.

    The row, its slots, the ``member.joined`` event and the advisory lock are made in one
    transaction of the membership session: no one can see the member without its lock held.
    A member of a protocol older than dirty-job tracking needs is refused (MemberRefused)
    while a job that tracks its recovery runs: it could not take part in the tracking.
    """
    member_uuid = uuidlib.uuid4()
    host = socket.gethostname()
    pid = os.getpid()
    address = address or f"{host}:{pid}"
    conn = connect_dedicated(member_application_name(member_uuid))
    try:
        with conn.transaction():
            _refuse_if_tracking(conn, name, protocol_version)
            member_id = conn.execute(
                """
                INSERT INTO engine_member
                    (uuid, name, address, host, pid, state, slot_mode, slot_count,
                     protocol_version, tags, started_at, last_heartbeat, end_reason)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now(), now(), '')
                RETURNING id
                """,
                (
                    member_uuid,
                    name,
                    address,
                    host,
                    pid,
                    MemberState.ALIVE,
                    slot_mode,
                    slots,
                    protocol_version,
                    psycopg.types.json.Jsonb(tags or {}),
                ),
            ).fetchone()[0]
            conn.execute("SELECT pg_advisory_lock(%s, %s)", member_lock_key(member_id))
            if slot_mode == SlotMode.FIXED:
                create_fixed_slots(conn, member_id, slots)
            joined = builders.member_joined(
                Member(
                    id=member_id,
                    uuid=member_uuid,
                    name=name,
                    address=address,
                    slot_mode=slot_mode,
                    slot_count=slots,
                    protocol_version=protocol_version,
                    tags=tags or {},
                )
            )
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", EVENT_APPEND)
            conn.execute(
                """
                INSERT INTO engine_engineevent (at, kind, member_id, payload)
                VALUES (now(), %s, %s, %s)
                """,
                (joined.kind, member_id, psycopg.types.json.Jsonb(joined.payload)),
            )
    except BaseException:
        conn.close()
        raise
    log.info("member %s registered as %s (%s slots, %s)", name, member_uuid, slots, slot_mode)
    return MemberSession(id=member_id, uuid=member_uuid, name=name, conn=conn)


def _refuse_if_tracking(conn: psycopg.Connection, name: str, protocol_version: int) -> None:
    """Under the gate a tracking-enabled job's submission takes too (engine.cluster.versions)."""
    with conn.cursor() as cur:
        message = tracking_refusal(cur, f"member {name}", protocol_version, "join", "worker")
        message = message or writer_refusal(cur, f"member {name}", protocol_version)
    if message:
        log.error("registration refused: %s", message)
        raise MemberRefused(message)


def _end_membership(
    member_id: int,
    state: str,
    reason: str,
    epoch: int | None = None,
    classification: str | None = None,
) -> Member | None:
    """ALIVE -> ``state`` with the sequence bump and the event, inside the caller's transaction.

    Returns the member if this call ended it, None if it was already ended (a no-op). The
    dirty-job incidents of the loss are registered here too (engine.dirty), so they exist
    before the master fails the member's task groups, and the sequence is bumped first.
    """
    check_transition(MEMBER_TRANSITIONS, MemberState.ALIVE, state)
    with connection.cursor() as cur:
        # One statement: the sequence moves only if this update ended the member.
        cur.execute(
            """
            WITH ended AS (
                UPDATE engine_member SET state = %s, ended_at = now(), end_reason = %s
                 WHERE id = %s AND state = %s
                RETURNING uuid, name, address, pid
            ), bumped AS (
                UPDATE engine_clusterstate
                   SET member_event_sequence = member_event_sequence + 1
                 WHERE id = 1 AND EXISTS (SELECT 1 FROM ended)
                RETURNING member_event_sequence
            )
            SELECT e.uuid, e.name, e.address, e.pid, b.member_event_sequence
              FROM ended e LEFT JOIN bumped b ON true
            """,
            [state, reason, member_id, MemberState.ALIVE],
        )
        row = cur.fetchone()
        if row is None:
            return None
        if row[4] is None:
            raise RuntimeError("the cluster state row is missing: no member event sequence")
        seq = row[4]
    member = Member(id=member_id, uuid=row[0], name=row[1], address=row[2], pid=row[3], state=state)
    tracked = dirty.on_member_lost(member, seq, epoch, classification)  # waits for job state
    # The tracked rows are written before the append lock, which the events then take.
    tracked.append(builders.member_ended(member, reason, seq, epoch, tracked.classification))
    return member


def leave(member_id: int, reason: str = "graceful shutdown") -> bool:
    """A member says it is stopping (SIGTERM): LEFT at once. True if this call made it LEFT."""
    with transaction.atomic():
        return _end_membership(member_id, MemberState.LEFT, reason) is not None


def leave_drained(epoch: int, member_id: int, reason: str) -> Member | None:
    """Active master: a drained member it verified empty leaves as LEFT, PLANNED_VERIFIED (in the
    caller's fenced transaction). Its sessions are ended as a removed member's are, so nothing
    of the old process can finish a write after it."""
    return _end_membership(
        member_id, MemberState.LEFT, reason, epoch, LeaveClassification.PLANNED_VERIFIED
    )


def remove_member(epoch: int, member_id: int, reason: str) -> bool:
    """Active master: mark a member REMOVED. Fenced by ``epoch``; exactly once per member."""
    with fenced(epoch):
        member = _end_membership(member_id, MemberState.REMOVED, reason, epoch)
    if member is None:
        return False
    log.warning("member %s (%s) REMOVED: %s", member.name, member.uuid, reason)
    end_member_sessions(member)
    return True


def end_member_sessions(member: Member) -> None:
    """End every session of a removed member (its membership session, its Django sessions and
    its sink sessions in any database of this server), so a frozen member that wakes finds
    itself fenced and cannot finish a half-done write.

    One statement: ``keel_end_session`` (a database function) ends one session and returns
    why it could not, so a session we may not end (a sink session logged in as a role the
    engine is not a member of) is logged and passed over, and never spares the others."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT pid, usename, application_name, keel_end_session(pid)
              FROM pg_stat_activity
             WHERE ((datname = current_database() AND application_name IN (%s, %s))
                OR application_name LIKE %s)
               AND pid <> pg_backend_pid()
             ORDER BY pid
            """,
            [
                member_application_name(member.uuid),
                django_application_name(member.name, member.pid),
                member_sink_sessions(member.uuid),
            ],
        )
        refused = [row for row in cur.fetchall() if row[3] is not None]
    for pid, role, name, error in refused:
        log.warning(
            "could not end session %s (%s, role %s) of removed member %s: %s",
            pid,
            name,
            role,
            member.name,
            error.strip().splitlines()[0] if error.strip() else "refused",
        )


def find_dead_members(heartbeat_timeout: float) -> list[tuple[int, str]]:
    """ALIVE members whose lock is gone or whose heartbeat is older than the timeout.

    A database restart, or a failover to a standby, ends every session at once: for one
    heartbeat timeout after it, a missing lock is not a death (members are reconnecting), and
    heartbeats count from it (``SERVER_SINCE``).

    Returns (member id, reason) in id order (a deterministic order for the removals).
    """
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT m.id,
                   CASE WHEN l.objid IS NULL THEN 'membership session ended'
                        ELSE 'heartbeat timeout' END
              FROM engine_member m
              LEFT JOIN pg_locks l
                ON l.locktype = 'advisory'
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = %s AND l.objid::bigint = m.id AND l.objsubid = 2 AND l.granted
             WHERE m.state = %s
               AND ((l.objid IS NULL
                     AND {SERVER_SINCE} < now() - make_interval(secs => %s))
                    OR greatest(m.last_heartbeat, {SERVER_SINCE})
                       < now() - make_interval(secs => %s))
             ORDER BY m.id
            """,
            [MEMBER_NAMESPACE, MemberState.ALIVE, heartbeat_timeout, heartbeat_timeout],
        )
        return [(row[0], row[1]) for row in cur.fetchall()]


def sweep_members(epoch: int, heartbeat_timeout: float) -> int:
    """Active-master step: remove every dead member; returns how many this call removed."""
    removed = 0
    for member_id, reason in find_dead_members(heartbeat_timeout):
        if remove_member(epoch, member_id, reason):
            removed += 1
    return removed
