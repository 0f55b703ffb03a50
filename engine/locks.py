"""PostgreSQL advisory-lock keys used by the engine (two-int4 form: namespace, object).

Advisory locks are scoped to the current database, so clusters in different databases of one
server (tests, several local clusters) never collide.
"""

from __future__ import annotations

#: (namespace, 1): held by the active master's dedicated lock session for its whole tenure.
LEADERSHIP = (19269, 1)
#: (namespace, 2): transaction-scoped; serialises event appends so ``seq`` commits in order.
EVENT_APPEND = (19269, 2)
#: (namespace, 3): transaction-scoped; orders a tracking-enabled job's submission with an
#: older-protocol member's registration or master's takeover, so one of them always sees the
#: other (and is refused).
DIRTY_VERSION_GATE = (19269, 3)
#: (namespace, 4): transaction-scoped; serialises task log shipments so line ids commit in order.
LOG_APPEND = (19269, 4)
#: (namespace, member id): held by a member's membership session for the member's whole life.
MEMBER_NAMESPACE = 19270


def member_lock_key(member_id: int) -> tuple[int, int]:
    if not 0 < member_id < 2**31:
        raise ValueError(f"member id {member_id} does not fit an int4 advisory-lock key")
    return (MEMBER_NAMESPACE, member_id)
