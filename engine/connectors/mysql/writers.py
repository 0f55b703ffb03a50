"""The Jdbc sink's writers on MySQL and MariaDB: at-least-once (each batch loaded and, with
``primary_keys``, upserted at once) and exactly-once through a durable stage whose rows move
into the target when their checkpoint completes, in one transaction fenced against the
writer's older attempts by a row of ``keel_writer_fence`` (docs/decisions/0035)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pymysql

from engine.connectors.base import SinkWriter
from engine.connectors.batches import data
from engine.connectors.jdbc_sessions import writer_key
from engine.connectors.jdbc_statements import custom_statement, target_columns, upsert_keys
from engine.connectors.mysql.sessions import (
    LOCK_WAIT,
    connect,
    load_data,
    local_infile_allowed,
    quote,
    text,
)
from engine.connectors.mysql.source import split_table, table_columns
from engine.connectors.mysql.types import create_table_sql, load_payload
from engine.connectors.schema import Schema, jsonable, kind_args

FENCE_TABLE = "keel_writer_fence"
STAGE_SUFFIX = "__keel_stage"
#: MySQL's longest table name (characters).
NAME_MAX = 64


class Fenced(RuntimeError):
    """A newer attempt of this writer raised the fence: this one may commit nothing."""


def stage_name(table: str) -> str:
    """The stage of ``table``: ``<table>__keel_stage``, or when that is longer than MySQL
    allows, the table's first characters and a digest of its whole name (stable: every
    attempt of every writer of the table finds the same stage)."""
    name = table + STAGE_SUFFIX
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.blake2b(table.encode(), digest_size=8).hexdigest()
    return f"{table[: NAME_MAX - len(STAGE_SUFFIX) - len(digest) - 1]}_{digest}{STAGE_SUFFIX}"


def upsert_clause(columns: list[str], keys: list[str]) -> str:
    """``ON DUPLICATE KEY UPDATE`` for an upsert on ``keys`` (the last row of a key wins); no
    keys: a plain insert."""
    if not keys:
        return ""
    updates = [c for c in columns if c not in keys] or keys[:1]
    return " ON DUPLICATE KEY UPDATE " + ", ".join(
        f"{quote(c)} = VALUES({quote(c)})" for c in updates
    )


def create_table(config: dict, schema: Schema, keys: list[str] | None = None) -> None:
    """Create the sink's table for a stream (a save mode), unless it exists."""
    with connect(config) as conn, conn.cursor() as cur:
        cur.execute(create_table_sql(quote(config["table"]), schema, keys))


def _values(batch: pa.RecordBatch, schema: Schema) -> list[tuple]:
    """A batch's rows as the driver's values (arrays, maps and rows as JSON)."""
    columns = []
    for i, kind in enumerate(schema.kinds):
        values = batch.column(i).to_pylist()
        if kind_args(kind)[0] in ("array", "map", "row"):
            from engine.connectors.arrowrows import rows_of

            keel = [r[0] for r in rows_of(pa.table({"v": batch.column(i)}), Schema((("v", kind),)))]
            values = [None if v is None else json.dumps(jsonable(kind, v)) for v in keel]
        columns.append(values)
    return list(zip(*columns, strict=True))


class _MySqlSink(SinkWriter):
    """A sink session and how a batch lands in a table: LOAD DATA LOCAL from memory where the
    URL and the server allow it, else multi-row INSERTs."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.schema = schema
        self.writer = writer_key(context)
        self.attempt = int(context.get("attempt", 0))
        self.columns = target_columns(config, schema)
        self.keys = upsert_keys(config)
        self.conn = connect(config, program=f"keel-sink:{self.attempt}")
        try:
            self.bulk = local_infile_allowed(self.conn)
            self.database, self.name = split_table(config, config.get("table") or "x")
        except BaseException:
            self.conn.close()
            raise

    def execute(self, statement: str, args=None) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())

    def load(self, table: str, batch: pa.RecordBatch, extra: dict[str, object]) -> None:
        """The batch's rows (plus ``extra`` constant columns) into ``table`` (quoted)."""
        batch, schema = data(batch), self.schema
        names = [*self.columns, *extra]
        if extra:
            fields = list(schema.fields)
            for name, value in extra.items():
                kind = "bigint" if isinstance(value, int) else "string"
                batch = batch.append_column(name, pa.array([value] * batch.num_rows))
                fields.append((name, kind))
            schema = Schema(tuple(fields))
        quoted = [quote(n) for n in names]
        if self.bulk:
            load_data(self.conn, table, quoted, load_payload(batch, schema))
            return
        marks = ", ".join(["%s"] * len(names))
        with self.conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} ({', '.join(quoted)}) VALUES ({marks})",
                _values(batch, schema),
            )

    def close(self) -> None:
        self.conn.close()

    def abort(self) -> None:
        self.conn.close()


class MySqlWriter(_MySqlSink):
    """At-least-once (no checkpoints): each batch in its own transaction, straight into the
    table, or through a temporary stage and ``INSERT ... ON DUPLICATE KEY UPDATE`` when
    upserting on ``primary_keys``; a custom ``query`` runs once per row."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        super().__init__(config, schema, context)
        self.custom = custom_statement(config["query"]) if config.get("query") else None
        self.table = quote(config["table"]) if config.get("table") else ""
        if self.keys and not self.custom:
            cols = ", ".join(quote(c) for c in self.columns)
            self.execute(
                f"CREATE TEMPORARY TABLE keel_stage AS SELECT {cols} FROM {self.table} LIMIT 0"
            )
            self.execute(
                "ALTER TABLE keel_stage ADD COLUMN keel_seq BIGINT AUTO_INCREMENT PRIMARY KEY"
            )
            self.move = (
                f"INSERT INTO {self.table} ({cols}) SELECT {cols} FROM keel_stage "
                f"ORDER BY keel_seq{upsert_clause(self.columns, self.keys)}"
            )

    def write(self, batch) -> None:
        if self.custom:
            with self.conn.cursor() as cur:
                cur.executemany(self.custom, _values(data(batch), self.schema))
        elif self.keys:
            self.load("keel_stage", batch, {})
            self.execute(self.move)
            self.execute("DELETE FROM keel_stage")
        else:
            self.load(self.table, batch, {})
        self.conn.commit()


class MySqlExactlyOnceWriter(_MySqlSink):
    """Exactly-once for checkpointed jobs. Batches go to ``<table>__keel_stage`` tagged with
    the writer's key and attempt; at barrier N a mark row closes N's rows. When N completes
    they move to the target and leave the stage in one transaction that first locks the
    writer's fence row and finds its own attempt there: a stale attempt moves nothing. A new
    attempt raises the fence, finishes the commit of the checkpoint it restores from, and
    drops every other row of older attempts (they are replayed)."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        super().__init__(config, schema, context)
        try:
            if config.get("query"):
                raise ValueError("a custom query is not written exactly once on MySQL: use table")
            self.table = quote(f"{self.database}.{self.name}")
            self.stage = quote(f"{self.database}.{stage_name(self.name)}")
            self.fence = quote(f"{self.database}.{FENCE_TABLE}")
            self._open(context.get("restoredCheckpoint"))
        except BaseException:
            self.conn.close()
            raise

    def _open(self, restored: int | None) -> None:
        self.execute(
            f"CREATE TABLE IF NOT EXISTS {self.fence} (writer VARCHAR(191) PRIMARY KEY,"
            " attempt BIGINT NOT NULL)"
        )
        self.execute(
            f"INSERT INTO {self.fence} VALUES (%s, %s)"
            " ON DUPLICATE KEY UPDATE attempt = GREATEST(attempt, VALUES(attempt))",
            (self.writer, self.attempt),
        )
        self.conn.commit()
        self._ensure_stage()
        if restored is not None:
            self._move("keel_attempt < %s AND keel_checkpoint <= %s", (self.attempt, restored))
        self._locked()
        self.execute(
            f"DELETE FROM {self.stage} WHERE keel_writer = %s AND keel_attempt < %s",
            (self.writer, self.attempt),
        )
        self.conn.commit()

    def _ensure_stage(self) -> None:
        """The stage: every target column (nullable: a mark row has none), plus the writer,
        attempt, checkpoint, mark and an order. A stage left by an older shape of the table
        (a save mode recreated it) gains its new columns and takes its columns' new types;
        columns the table lost stay, unused. Writers opening at once take turns (a lock)."""
        typed = table_columns(self.conn, self.database, self.name)
        cols = ", ".join(f"{quote(n)} {t} NULL" for n, t in typed)
        self.execute(
            f"CREATE TABLE IF NOT EXISTS {self.stage} ({cols}, keel_writer VARCHAR(191) NOT NULL,"
            " keel_attempt BIGINT NOT NULL, keel_checkpoint BIGINT NULL,"
            " keel_mark TINYINT(1) NOT NULL DEFAULT 0,"
            " keel_seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " KEY keel_writer_seq (keel_writer, keel_attempt, keel_seq)) DEFAULT CHARSET=utf8mb4"
        )
        digest = hashlib.blake2b(self.stage.encode(), digest_size=16).hexdigest()
        [(got,)] = self.execute("SELECT GET_LOCK(%s, %s)", (f"keel-stage:{digest}", LOCK_WAIT))
        if text(got) != "1":
            raise RuntimeError(f"{self.stage}: another writer is changing it (try again)")
        try:
            staged = dict(table_columns(self.conn, self.database, stage_name(self.name)))
            changes = [
                f"{'MODIFY' if n in staged else 'ADD'} COLUMN {quote(n)} {t} NULL"
                for n, t in typed
                if staged.get(n) != t
            ]
            if changes:
                self.execute(f"ALTER TABLE {self.stage} {', '.join(changes)}")
        finally:
            self.execute("SELECT RELEASE_LOCK(%s)", (f"keel-stage:{digest}",))

    def _locked(self, mode: str = "FOR UPDATE") -> None:
        """Lock the writer's fence row until the transaction ends; Fenced (after a rollback)
        unless the row still names this attempt."""
        rows = self.execute(
            f"SELECT attempt FROM {self.fence} WHERE writer = %s {mode}", (self.writer,)
        )
        if not rows or int(text(rows[0][0])) != self.attempt:
            self.conn.rollback()
            raise Fenced(f"writer {self.writer}: attempt {self.attempt} was fenced by a newer one")

    def _move(self, marks: str, args: tuple) -> int:
        """In one transaction under the fence: the rows each matching mark closes (the rows
        of the mark's attempt staged before it) into the target, then out of the stage with
        their marks; the rows moved."""
        try:
            moved = self._move_locked(marks, args)
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()
        return moved

    def _move_locked(self, marks: str, args: tuple) -> int:
        self._locked()
        cuts = self.execute(
            f"SELECT keel_attempt, max(keel_seq) FROM {self.stage} WHERE keel_writer = %s"
            f" AND keel_mark = 1 AND {marks} GROUP BY keel_attempt",
            (self.writer, *args),
        )
        moved = 0
        for attempt, cut in cuts:
            attempt, cut = int(text(attempt)), int(text(cut))
            scope = "keel_writer = %s AND keel_attempt = %s AND keel_seq <= %s"
            cols = ", ".join(quote(c) for c in self.columns)
            with self.conn.cursor() as cur:
                moved += cur.execute(
                    f"INSERT INTO {self.table} ({cols}) SELECT {cols} FROM {self.stage}"
                    f" WHERE {scope} AND keel_mark = 0 ORDER BY keel_seq"
                    + upsert_clause(self.columns, self.keys),
                    (self.writer, attempt, cut),
                )
                cur.execute(f"DELETE FROM {self.stage} WHERE {scope}", (self.writer, attempt, cut))
        return moved

    def write(self, batch) -> None:
        self.staged(
            lambda: self.load(
                self.stage, batch, {"keel_writer": self.writer, "keel_attempt": self.attempt}
            )
        )

    def staged(self, work) -> None:
        """Stage in one transaction that first holds the fence row shared, unless a newer
        attempt raised it (Fenced, rolled back): the newer one deletes the rows of older
        attempts once, so a row staged after that (a zombie woken mid-LOAD DATA) must never be
        committed, or a later restore would move it. The fence row is locked before the stage
        rows, in the order a newer attempt's fence takes them: no lock cycle."""
        try:
            self._locked("LOCK IN SHARE MODE")
            work()
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()

    def prepare_commit(self, checkpoint_id: int) -> dict:
        """Mark the cut: a row above every row this attempt staged before the barrier."""
        self.staged(
            lambda: self.execute(
                f"INSERT INTO {self.stage} (keel_writer, keel_attempt, keel_checkpoint, keel_mark)"
                " VALUES (%s, %s, %s, 1)",
                (self.writer, self.attempt, checkpoint_id),
            )
        )
        return {"writer": self.writer, "attempt": self.attempt, "checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        self._move(
            "keel_attempt = %s AND keel_checkpoint <= %s", (self.attempt, state["checkpoint"])
        )

    def close(self) -> None:
        """A batch pipeline finished: everything this attempt staged becomes visible."""
        try:
            self.prepare_commit(2**62)
            self._move("keel_attempt = %s AND keel_checkpoint <= %s", (self.attempt, 2**62))
        finally:
            self.conn.close()

    def abort(self) -> None:
        self.conn.close()


def rows_in(config: dict, table: str) -> int:
    """Rows of a table (for checks and tests)."""
    with connect(config, read_only=True) as conn, conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT count(*) FROM {quote(table)}")
        return int(text(cur.fetchone()[0]))
