"""Appending to the event store.

Events are appended in the transaction of the state change they describe (transactional outbox).
A plain ``bigserial`` is not enough for readers that page with ``after=seq``: two transactions can
draw seq 10 and 11 and commit 11 first, and a reader that saw 11 would skip 10 for ever. So every
append first takes one transaction-scoped advisory lock: seq values are drawn and committed in
order. The lock is held only from the append to the commit, and appends are the last statement of
their transaction (deferred foreign-key checks are run just before), so it cannot take part in a
deadlock (docs/decisions/0002-event-order.md). Row locks are taken ``FOR NO KEY UPDATE``
everywhere, so they never block another transaction's foreign-key checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection

from engine.locks import EVENT_APPEND
from engine.models import EngineEvent


def append_events(events: Iterable[EngineEvent]) -> list[EngineEvent]:
    """Append events inside the caller's transaction; must be its last write."""
    events = list(events)
    if not events:
        return events
    if not connection.in_atomic_block:
        raise RuntimeError("append_events must run inside the state change's transaction")
    with connection.cursor() as cur:
        # Foreign keys are checked at commit by default: check them now, so the commit never
        # waits for a row lock while this transaction holds the append lock.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", EVENT_APPEND)
    return EngineEvent.objects.bulk_create(events)


def append_event(
    kind: str,
    *,
    member=None,
    job_id: int | None = None,
    epoch: int | None = None,
    payload: dict[str, Any] | None = None,
) -> EngineEvent:
    """Append one event; see append_events."""
    return append_events(
        [EngineEvent(kind=kind, member=member, job_id=job_id, epoch=epoch, payload=payload or {})]
    )[0]
