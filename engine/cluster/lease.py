"""The active master's lease, renewed by a thread of its own on the leadership lock session.

The master's loop does the work of the cluster (membership, restores, checkpoints, scheduling);
under load one of its passes can take longer than the lease. Renewing from that loop made a
busy master lose its lease while it was working, a standby end its sessions, and the next
master do the same: a storm of takeovers after one failover. So the lease is renewed here, every
``interval``, by one statement on the session that holds the leadership lock (proving in the same
statement that the session still holds it), whatever the loop is doing.

What the thread cannot see, the loop tells it: the loop ``beat()``s before every step, and the
thread stops renewing once the loop has not beaten for ``stall_limit`` (a loop wedged for good
must not keep the cluster's leadership). A frozen process freezes this thread too, so its lease
expires as before (docs/decisions/0001-master-election.md).
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

log = logging.getLogger("keel.election")

RENEW = """
UPDATE engine_masterlease
   SET renewed_at = clock_timestamp(),
       expires_at = clock_timestamp() + make_interval(secs => %s)
 WHERE id = 1 AND epoch = %s AND holder = %s AND lock_backend_pid = pg_backend_pid()
"""


class LeaseLost(Exception):
    """The lease could not be renewed: ``stale`` if another epoch or holder has it now, else
    the lock session failed (it may have ended, and the lock with it)."""

    def __init__(self, message: str, stale: bool) -> None:
        super().__init__(message)
        self.stale = stale


def renew_on(conn: psycopg.Connection, epoch: int, holder: str, lease_timeout: float) -> None:
    """Extend the lease of ``epoch`` by one statement on the lock session ``conn``."""
    try:
        renewed = conn.execute(RENEW, (lease_timeout, epoch, holder)).rowcount
    except psycopg.Error as exc:
        raise LeaseLost(f"the leadership lock session failed: {exc}".strip(), stale=False) from exc
    if renewed != 1:
        raise LeaseLost(f"the lease of epoch {epoch} is no longer {holder}'s", stale=True)


class LeaseKeeper:
    """Renews one term's lease until stopped, the loop stalls, or a renewal fails; the loop
    reads the outcome with ``check()``."""

    def __init__(
        self,
        conn: psycopg.Connection,
        epoch: int,
        holder: str,
        lease_timeout: float,
        stall_limit: float,
    ) -> None:
        self.conn, self.epoch, self.holder = conn, epoch, holder
        self.lease_timeout = lease_timeout
        self.interval = max(lease_timeout / 6, 0.05)
        self.stall_limit = stall_limit
        self.lost: LeaseLost | None = None
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """The loop is making progress (called before each of its steps)."""
        self._beat = time.monotonic()

    def check(self) -> None:
        """Raise what ended the renewals, if anything did."""
        if self.lost is not None:
            raise self.lost

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.interval + 2)

    def _run(self) -> None:
        stalled = False
        while not self._stop.wait(self.interval):
            if time.monotonic() - self._beat > self.stall_limit:
                if not stalled:
                    log.error(
                        "the master loop made no progress for %.0fs: the lease of epoch %s is "
                        "no longer renewed",
                        self.stall_limit,
                        self.epoch,
                    )
                stalled = True
                continue
            stalled = False
            try:
                renew_on(self.conn, self.epoch, self.holder, self.lease_timeout)
            except LeaseLost as exc:
                self.lost = exc
                return
