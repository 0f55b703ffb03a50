"""Epoch fencing for every write made on behalf of the active master.

A master that was frozen (SIGSTOP, a long GC pause, a half-open network) may wake up believing it
still leads. Each of its writes therefore runs in ``fenced(epoch)``: the transaction first reads the
lease row's epoch under ``FOR KEY SHARE`` and aborts with StaleEpoch unless it is still ours. A
takeover bumps the epoch under ``FOR UPDATE``, which waits for every fenced transaction in flight,
so no write of the old epoch can commit after the new epoch exists. Lease renewals are plain
updates (``FOR NO KEY UPDATE``), which do not conflict with key-share readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


class StaleEpoch(Exception):
    """This process's master epoch is no longer the current one: it must stop writing."""

    def __init__(self, mine: int | None, current: int | None) -> None:
        super().__init__(f"epoch {mine} is stale (current epoch is {current})")
        self.mine = mine
        self.current = current


def current_epoch() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT epoch FROM engine_masterlease WHERE id = 1")
        row = cur.fetchone()
    return row[0] if row else 0


@contextmanager
def fenced(epoch: int | None) -> Iterator[None]:
    """A transaction that commits only if ``epoch`` is still the active master's epoch."""
    with transaction.atomic():
        with connection.cursor() as cur:
            # Never wait long for a lock on behalf of the master: a frozen lock holder must not
            # make us miss the lease renewal. The step fails and is retried on a later tick.
            # One round trip for both: every master write starts here.
            cur.execute(
                "SET LOCAL lock_timeout = '1000ms';"
                " SELECT epoch FROM engine_masterlease WHERE id = 1 FOR KEY SHARE"
            )
            cur.nextset()
            row = cur.fetchone()
        current = row[0] if row else None
        if epoch is None or current != epoch:
            raise StaleEpoch(epoch, current)
        yield
