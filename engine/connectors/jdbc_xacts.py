"""PostgreSQL's prepared transactions as the Jdbc sink's two-phase writer names them
(``keel:<writer>:<checkpoint>:<attempt>``): finding a writer's, and settling them against a
checkpoint (committed up to it, rolled back after it). Either Jdbc writer settles what an older
attempt left prepared when it opens (the writer a job uses may change between attempts)."""

from __future__ import annotations

import re
from typing import NamedTuple

import psycopg
from psycopg import sql

GID_PREFIX = "keel:"
_GID = re.compile(r"^keel:(?P<writer>[^:]+):(?P<checkpoint>-?[0-9]+):(?P<attempt>[0-9]+)$")


def transaction_id(writer: str, checkpoint: int, attempt: int) -> str:
    return f"{GID_PREFIX}{writer}:{checkpoint}:{attempt}"


class Prepared(NamedTuple):
    gid: str
    writer: str
    checkpoint: int
    attempt: int


def prepared(conn: psycopg.Connection, prefix: str) -> list[Prepared]:
    """This database's prepared transactions whose gid starts with ``prefix``, oldest
    checkpoint first."""
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s)",
        (prefix,),
    ).fetchall()
    found = [
        Prepared(gid, m["writer"], int(m["checkpoint"]), int(m["attempt"]))
        for (gid,) in rows
        if (m := _GID.match(gid))
    ]
    return sorted(found, key=lambda p: (p.checkpoint, p.gid))


def settle(
    conn: psycopg.Connection, found: list[Prepared], upto: int, rollback: bool = True
) -> tuple[int, int]:
    """Commit every prepared transaction of ``found`` up to checkpoint ``upto`` (in checkpoint
    order), and roll back the later ones when ``rollback``. One settled by another session
    meanwhile is passed over. ``conn`` autocommits (these statements refuse a transaction).
    Returns (committed, rolled back)."""
    committed = rolled_back = 0
    for gid, _, checkpoint, _ in found:
        if checkpoint <= upto:
            statement = sql.SQL("COMMIT PREPARED {}")
        elif rollback:
            statement = sql.SQL("ROLLBACK PREPARED {}")
        else:
            continue
        try:
            conn.execute(statement.format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            continue
        if checkpoint <= upto:
            committed += 1
        else:
            rolled_back += 1
    return committed, rolled_back


def settle_leftovers(conn: psycopg.Connection, writer: str, restored: int | None) -> None:
    """After the fence: what older attempts of ``writer`` prepared, settled against the
    checkpoint this attempt restores from (none: everything rolled back). ``conn`` is left as
    it was (autocommit or not)."""
    autocommit = conn.autocommit
    if not autocommit:
        conn.commit()
        conn.autocommit = True
    try:
        found = prepared(conn, f"{GID_PREFIX}{writer}:")
        if found:
            settle(conn, found, -1 if restored is None else restored)
    finally:
        conn.autocommit = autocommit
