"""Statements sent together: several under a savepoint of their own, in one round trip.

A hot path pays a round trip per statement (about as much as a commit on this kind of machine),
and a Django ``atomic`` savepoint adds two. Statements joined into one query string cost one:
Django's psycopg cursor binds parameters on the client and sends the string whole, and the
server runs the statements in order and stops at the first error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connection

#: (one SQL statement, its named parameters or None).
Step = tuple[str, dict[str, Any] | None]


def in_savepoint(name: str, steps: Sequence[Step]) -> list[tuple]:
    """Run ``steps`` in the caller's transaction under savepoint ``name``, in one round trip;
    the last step's rows. On an error the savepoint is rolled back (the caller's transaction
    carries on, as after a failed ``atomic`` block) and the error is raised."""
    if not connection.in_atomic_block:
        raise RuntimeError("in_savepoint runs inside the caller's transaction")
    params: dict[str, Any] = {}
    for _, step_params in steps:
        params.update(step_params or {})
    statements = [f"SAVEPOINT {name}", *(sql for sql, _ in steps), f"RELEASE SAVEPOINT {name}"]
    with connection.cursor() as cur:
        try:
            cur.execute("; ".join(statements), params or None)
        except DatabaseError:
            try:
                cur.execute(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
            except DatabaseError:
                pass  # the session is gone: the caller's transaction fails with the first error
            raise
        for _ in steps:
            cur.nextset()  # the first result is the savepoint's
        return cur.fetchall() if cur.description else []
