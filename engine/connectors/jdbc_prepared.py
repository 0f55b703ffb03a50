"""The Jdbc sink's two-phase writer (``is_exactly_once = true``): a checkpointed job's batches go
straight into the target inside a transaction that is PREPAREd at each barrier and COMMITted
PREPARED once its checkpoint completes. This is what SeaTunnel's XA sink does through pgJDBC's
XA data source, with PostgreSQL's own statements: each row is written once, where the staging
writer writes it into the stage, then the target, then deletes it.

A prepared transaction's name (its gid) is ``keel:<writer>:<checkpoint>:<attempt>``: the writer
key is the same for every attempt of one reader's sink, so a new attempt finds what the older
ones prepared, after fencing them, and settles it against the checkpoint it restores from:
prepared up to that checkpoint is committed (its data is covered by the restored offsets),
anything later rolled back (it is replayed). What a job leaves prepared when it ends (a cancel,
a failure with no retry left) is settled by its terminal-state cleanup, against its newest
completed checkpoint (``settle_job``).
"""

from __future__ import annotations

import logging

from psycopg import sql

from engine.connectors.base import SinkWriter
from engine.connectors.jdbc_dialect import family
from engine.connectors.jdbc_ingest import (
    ArrowStage,
    bulk_capable,
    not_direct,
)
from engine.connectors.jdbc_sessions import (
    connect_sink,
    connect_sink_arrow,
    fence_older_attempts,
    sink_session_options,
    writer_key,
)
from engine.connectors.jdbc_statements import psycopg_string, regclass, target_columns, upsert_keys
from engine.connectors.jdbc_xacts import (
    GID_PREFIX,
    Prepared,
    prepared,
    settle,
    settle_leftovers,
    transaction_id,
)
from engine.connectors.pg import connect, split_table, table_ident
from engine.connectors.schema import Schema

log = logging.getLogger("keel.jdbc")

#: A prepared writer's transaction stays open between batches until the next barrier, which
#: waits while a checkpoint is pending: the session's idle limit covers a checkpoint's timeout
#: and two intervals (a frozen worker's session is ended by its member's removal, or by the
#: next attempt's fence, well before).
IDLE_FLOOR_MS = 60_000


def session_options(context: dict) -> str:
    """The sink session's options, its idle-in-transaction limit covering a pending
    checkpoint and two intervals (the transaction spans one interval and waits while a
    checkpoint is pending)."""
    interval = int(context.get("checkpointInterval") or 0)
    timeout = int(context.get("checkpointTimeout") or 60_000)
    return sink_session_options(max(IDLE_FLOOR_MS, timeout + 2 * interval))


def open_prepared_writer(config: dict, schema: Schema, context: dict) -> SinkWriter | None:
    """The two-phase writer when it can write this sink, else None (after saying why): a
    plain insert (no keys, no custom query) into an ordinary table, of columns binary COPY
    writes as they are, on a server that allows prepared transactions."""
    why = _unfit_config(config, schema)
    if why:
        log.warning("%s: is_exactly_once uses the staging table: %s", context.get("label"), why)
        return None
    writer = writer_key(context)
    adbc = connect_sink_arrow(config, context, writer, session_options(context), autocommit=True)
    try:
        columns = target_columns(config, schema)
        with adbc.cursor() as cur:
            why, target_types = _unfit_target(cur, config, columns, schema.kinds)
            why = why or _staged_before(cur, config, writer)
        if why:
            log.warning("%s: is_exactly_once uses the staging table: %s", context.get("label"), why)
            adbc.close()
            return None
        return PreparedJdbcWriter(config, context, adbc, columns, target_types)
    except BaseException:
        adbc.close()
        raise


def _unfit_config(config: dict, schema: Schema) -> str:
    if config.get("query"):
        return "a custom query is run row by row"
    if upsert_keys(config):
        return "an upsert on primary_keys goes through a stage"
    if not bulk_capable(schema):
        return "arrays, maps or nested rows are written row by row"
    return ""


def _unfit_target(cur, config: dict, columns: list[str], kinds: list[str]):
    cur.execute("SELECT current_setting('max_prepared_transactions')::int")
    if cur.fetchone()[0] <= 0:
        return "the server's max_prepared_transactions is 0", None
    return not_direct(cur, regclass(table_ident(config["table"])), columns, kinds)


def _staged_before(cur, config: dict, writer: str) -> str:
    """An earlier attempt of this writer staged rows (it wrote through the stage): this one
    does too, so the stage's commit up to the restored checkpoint, and its drop of the rest,
    run (the rows a restore needs were staged before it began)."""
    schema_name, name = split_table(config["table"])
    stage = sql.Identifier(schema_name, f"{name}__keel_stage")
    cur.execute(f"SELECT to_regclass({regclass(stage)})")
    if cur.fetchone()[0] is None:
        return ""
    waiting = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE keel_writer = {})")
    cur.execute(psycopg_string(waiting.format(stage, sql.Literal(writer))))
    return "an earlier attempt's rows wait in the staging table" if cur.fetchone()[0] else ""


class PreparedJdbcWriter(SinkWriter):
    """Batches into the target in one open transaction per checkpoint interval, prepared at the
    barrier, committed when the checkpoint completes (see the module's docstring)."""

    def __init__(
        self,
        config: dict,
        context: dict,
        adbc,
        columns: list[str],
        target_types: dict[str, tuple[str, str]],
    ) -> None:
        self.writer = writer_key(context)
        self.attempt = int(context.get("attempt", 0))
        self.prefix = f"{GID_PREFIX}{self.writer}:"
        self.adbc = adbc
        self.open = False
        # The fenced session settles and commits: the ADBC session (same name, opened first)
        # only writes, so a newer attempt's fence ends both.
        self.conn = connect_sink(config, context, self.writer)
        try:
            fence_older_attempts(self.conn, self.writer, self.attempt)
            self.conn.autocommit = True
            settle_leftovers(self.conn, self.writer, context.get("restoredCheckpoint"))
            schema_name, table = split_table(config["table"])
            self.target = ArrowStage(adbc, schema_name, table, columns, target_types)
        except BaseException:
            self.conn.close()
            raise

    def write(self, batch) -> None:
        if batch.num_rows == 0:
            return
        if not self.open:
            self.target.cur.execute("BEGIN")
            self.open = True
        self.target.write(batch, commit=False)

    def prepare_commit(self, checkpoint_id: int) -> dict:
        """Phase one: what was written since the last barrier is prepared under this
        checkpoint's name (durable, invisible); nothing written, nothing prepared."""
        gid = None
        if self.open:
            gid = transaction_id(self.writer, checkpoint_id, self.attempt)
            prepare = sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid))
            self.target.cur.execute(psycopg_string(prepare))
            self.open = False
        return {"writer": self.writer, "checkpoint": checkpoint_id, "transaction": gid}

    def commit(self, state: dict) -> None:
        """Phase two for a completed checkpoint: every transaction this attempt prepared up to
        it (a checkpoint that failed before it is covered by it too; older attempts' were
        settled when this one opened)."""
        settle(self.conn, self._own(), int(state["checkpoint"]), False)

    def _own(self) -> list[Prepared]:
        return [p for p in prepared(self.conn, self.prefix) if p.attempt == self.attempt]

    def close(self) -> None:
        """A batch pipeline finished: everything it wrote becomes visible."""
        if self.open:
            self.target.cur.execute("COMMIT")
            self.open = False
        settle(self.conn, self._own(), 2**62, False)
        self.abort()

    def abort(self) -> None:
        """The open transaction rolls back with its session; prepared ones stay for the next
        attempt (or the job's cleanup) to settle against the checkpoints that completed."""
        try:
            target = getattr(self, "target", None)
            if target is not None:
                target.close()
            else:
                self.adbc.close()
        finally:
            self.conn.close()


def settle_job(config: dict, job_uuid: str, completed: dict[int, int]) -> tuple[int, int]:
    """What an ended job left prepared in one sink's database: committed up to its pipeline's
    newest completed checkpoint (``completed``: {pipeline index: checkpoint id}), the rest
    rolled back. Every writer key of the job starts with its uuid and pipeline index. A
    database without prepared transactions (MySQL: its stage keeps what a stale attempt
    wrote, never moved) has none to settle."""
    if family(config) != "postgresql":
        return 0, 0
    with connect(
        config, "keel-cleanup", autocommit=True, options="-c statement_timeout=30000"
    ) as conn:
        committed = rolled_back = 0
        for found in prepared(conn, f"{GID_PREFIX}{job_uuid}-"):
            pipeline = int(found.writer[len(job_uuid) + 1 :].split("-")[0])
            done = settle(conn, [found], completed.get(pipeline, -1))
            committed += done[0]
            rolled_back += done[1]
    return committed, rolled_back
