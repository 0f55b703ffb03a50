"""The Jdbc sink's writers: at-least-once (no checkpoints) and exactly-once (checkpointed),
and the sink sessions they write on."""

from __future__ import annotations

import hashlib

from psycopg import sql

from engine.connectors.base import SinkWriter
from engine.connectors.jdbc_ingest import (
    ArrowStage,
    bulk_capable,
    column_types,
    not_direct,
    text_staged,
    to_text_ddl,
)
from engine.connectors.jdbc_sessions import (
    connect_sink,
    connect_sink_arrow,
    fence_older_attempts,
    writer_key,
)
from engine.connectors.jdbc_statements import (
    STAGE_TYPES,
    _insert_from,
    custom_statement,
    psycopg_string,
    regclass,
    staged,
    target_columns,
    text_casts,
    upsert_keys,
    write_checks,
)
from engine.connectors.jdbc_xacts import settle_leftovers
from engine.connectors.pg import split_table, table_ident
from engine.connectors.schema import Schema, kind_args

#: The at-least-once writer's stage: a temporary table of the session, emptied at each commit.
TEMP_STAGE = sql.Identifier("keel_stage")


def temp_stage(table: sql.Composable, cols: sql.Composable) -> sql.Composed:
    return sql.SQL(
        "CREATE TEMP TABLE keel_stage ON COMMIT DELETE ROWS AS SELECT {cols} FROM {t} WITH NO DATA"
    ).format(cols=cols, t=table)


def from_temp_stage(
    table: sql.Composable,
    cols: sql.Composable,
    columns: list[str],
    keys: list[str],
    casts: dict[str, str] | None = None,
) -> sql.Composed:
    """The batch staged in the temporary stage, into the target (an upsert on ``keys``)."""
    return _insert_from(
        table, cols, TEMP_STAGE, sql.SQL("true"), sql.SQL("ctid"), columns, keys, casts
    )


class JdbcWriter(SinkWriter):
    """At-least-once writer (no checkpoints): each batch is COPYed into a temporary table and
    upserted (or inserted) at once. Batches go with ADBC's binary COPY (a custom query, or a
    stream with arrays, maps or nested rows, goes row by row through psycopg)."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.custom = custom_statement(config["query"]) if config.get("query") else None
        self.bulk = None
        if not self.custom and bulk_capable(schema):
            self._open_bulk(
                config, schema, connect_sink_arrow(config, context, writer_key(context))
            )
            return
        self.conn = connect_sink(config, context, writer_key(context))
        if self.custom:
            self.fit = staged(schema)
            return
        self.columns = target_columns(config, schema)
        table = table_ident(config["table"])
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        self.conn.execute(temp_stage(table, cols))
        with self.conn.cursor() as cur:
            types = column_types(cur, regclass(table))
        self.conn.commit()
        self.fit = staged(schema, [types[c][0] for c in self.columns])
        self.upsert = from_temp_stage(table, cols, self.columns, upsert_keys(config))
        self.copy = sql.SQL("COPY keel_stage ({cols}) FROM STDIN").format(cols=cols)

    def _open_bulk(self, config: dict, schema: Schema, adbc) -> None:
        """On the ADBC session ``adbc``: its temporary stage (text where Arrow cannot write
        the target's type) and the statement that moves a batch from it into the target."""
        self.columns = target_columns(config, schema)
        table = table_ident(config["table"])
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        kinds = schema.kinds
        try:
            self._stage_bulk(adbc, config, table, cols, kinds)
        except BaseException:
            adbc.close()
            raise

    def _stage_bulk(self, adbc, config: dict, table, cols, kinds: list[str]) -> None:
        """Where batches go: straight into an ordinary table when it is a plain insert of
        columns binary COPY writes as they come; else into the temporary stage, moved by an
        INSERT ... SELECT (an upsert on the keys) in the batch's transaction."""
        keys = upsert_keys(config)
        with adbc.cursor() as cur:
            why, target_types = not_direct(cur, regclass(table), self.columns, kinds)
            direct = not keys and not why
            if not direct:
                cur.execute(psycopg_string(temp_stage(table, cols)))
                stage_types = column_types(cur, "'keel_stage'")
                texts = text_staged(self.columns, kinds, stage_types)
                if texts:
                    cur.execute(psycopg_string(to_text_ddl(TEMP_STAGE, texts)))
                    stage_types = column_types(cur, "'keel_stage'")
        adbc.commit()
        if direct:
            # A plain insert of columns Arrow writes as they are: straight into the target
            # (what the stage's INSERT ... SELECT would do, without the second copy).
            schema_name, name = split_table(config["table"])
            self.upsert_sql = None
            self.bulk = ArrowStage(adbc, schema_name, name, self.columns, target_types)
            return
        casts = text_casts(self.columns, stage_types, target_types)
        self.upsert_sql = psycopg_string(from_temp_stage(table, cols, self.columns, keys, casts))
        self.bulk = ArrowStage(adbc, None, "keel_stage", self.columns, stage_types)

    def write(self, batch) -> None:
        if self.bulk is None:
            return super().write(batch)
        self.bulk.write(batch, commit=self.upsert_sql is None)
        if self.upsert_sql is not None:
            self.bulk.cur.execute(self.upsert_sql)
            self.bulk.adbc.commit()

    def write_rows(self, rows: list[tuple]) -> None:
        if self.custom:
            with self.conn.cursor() as cur:
                cur.executemany(self.custom, [self.fit(r) for r in rows])
            self.conn.commit()
            return
        with self.conn.cursor() as cur:
            with cur.copy(self.copy) as copy:
                for row in rows:
                    copy.write_row(self.fit(row))
            cur.execute(self.upsert)
        self.conn.commit()

    def close(self) -> None:
        if self.bulk is not None:
            self.bulk.close()
        else:
            self.conn.close()

    def abort(self) -> None:
        self.close()


class ExactlyOnceJdbcWriter(SinkWriter):
    """Exactly-once writer for checkpointed jobs.

    Rows go to a durable staging table ``<table>__keel_stage`` tagged with this writer's stable
    key (job, pipeline, reader: the same for every attempt), as Arrow batches (binary COPY). At
    barrier N the writer stages a mark (pre-commit): the rows staged before it are N's. When N
    completes they move to the target in one transaction and leave the stage with the mark, so
    committing N twice changes nothing. A new attempt first fences the older ones
    (``fence_older_attempts``), then finishes the commit of the checkpoint it restores from,
    then drops every later staged row: those rows are replayed.
    """

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.writer = writer_key(context)
        self.custom = custom_statement(config["query"]) if config.get("query") else None
        self.bulk = None
        self.casts: dict[str, str] = {}
        # The bulk session opens before the fence, under the same name: a newer attempt's
        # fence ends it with this one's, so nothing it sends lands after that fence.
        adbc = None
        if not self.custom and bulk_capable(schema):
            adbc = connect_sink_arrow(config, context, self.writer)
        try:
            self.conn = connect_sink(config, context, self.writer)
            self._open(config, schema, context, adbc)
        except BaseException:
            if adbc is not None:
                adbc.close()
            if getattr(self, "conn", None) is not None:
                self.conn.close()  # and with it the writer's lock, if the fence took it
            raise

    def _open(self, config: dict, schema: Schema, context: dict, adbc) -> None:
        self.fit = staged(schema) if self.custom else (lambda row: row)
        self.keys = upsert_keys(config)
        if self.custom:  # a stage of the incoming fields, shared by the query's writers
            self.columns = schema.names
            # Per query and incoming fields: another job's query of other fields has its own.
            shape = config["query"] + repr(schema.fields)
            digest = hashlib.blake2b(shape.encode(), digest_size=8).hexdigest()
            schema_name, name = "public", f"keel_query_{digest}"
            self.table = None
        else:
            self.columns = target_columns(config, schema)
            schema_name, name = split_table(config["table"])
            self.table = sql.Identifier(schema_name, name)
        self.stage = sql.Identifier(schema_name, f"{name}__keel_stage")
        self.cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        fence_older_attempts(self.conn, self.writer, context.get("attempt", 0))
        # An older attempt may have written with prepared transactions (is_exactly_once).
        settle_leftovers(self.conn, self.writer, context.get("restoredCheckpoint"))
        self._ensure_stage(schema_name, name, schema)
        if not self.custom:
            self._align_stage(adbc, schema_name, name, schema)
        restored = context.get("restoredCheckpoint")
        if restored is not None:
            self._commit_upto(restored)
        self.conn.execute(
            sql.SQL(
                "DELETE FROM {stage} WHERE keel_writer = %s AND "
                "(keel_checkpoint IS NULL OR keel_checkpoint > %s)"
            ).format(stage=self.stage),
            (self.writer, restored if restored is not None else -1),
        )
        self.conn.commit()
        self.copy = sql.SQL("COPY {stage} ({cols}, keel_writer) FROM STDIN").format(
            stage=self.stage, cols=self.cols
        )

    def _align_stage(self, adbc, schema_name: str, name: str, schema: Schema) -> None:
        """Stage columns Arrow cannot write become text (once, under the stage's DDL lock),
        cast back to the target's types when committed; batches go through ``adbc`` (if
        given), rows fitted to the target's types (nested values as JSON or arrays)."""
        kinds = schema.kinds
        with self.conn.cursor() as cur:
            stage_types = column_types(cur, regclass(self.stage))
            texts = text_staged(self.columns, kinds, stage_types)
            if texts:
                cur.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))",
                    (f"keel-stage:{schema_name}.{name}",),
                )
                stage_types = column_types(cur, regclass(self.stage))
                texts = text_staged(self.columns, kinds, stage_types)
                if texts:
                    cur.execute(to_text_ddl(self.stage, texts))
                    stage_types = column_types(cur, regclass(self.stage))
            target_types = column_types(cur, regclass(self.table))
        self.conn.commit()
        self.casts = text_casts(self.columns, stage_types, target_types)
        self.fit = staged(schema, [target_types[c][0] for c in self.columns])
        if adbc is None:
            return
        self.bulk = ArrowStage(
            adbc,
            schema_name,
            f"{name}__keel_stage",
            self.columns,
            stage_types,
            {"keel_writer": self.writer},
            write_checks(self.casts, target_types),
        )

    def _ensure_stage(self, schema_name: str, name: str, schema: Schema) -> None:
        """Create the staging table once. DDL takes an exclusive lock, so it runs only when
        something is missing: never queued behind another writer's open COPY."""
        present = {
            row[0]
            for row in self.conn.execute(
                "SELECT column_name::text FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s",
                (schema_name, f"{name}__keel_stage"),
            )
        }
        self.conn.commit()
        wanted = {"keel_writer", "keel_checkpoint", "keel_seq", "keel_mark", *self.columns}
        if wanted <= present:
            return
        # Readers of one job open their writers at the same moment: serialise the DDL (two
        # concurrent CREATE TABLE IF NOT EXISTS can both try to create the table).
        self.conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-stage:{schema_name}.{name}",)
        )
        if self.table is None:
            typed = sql.SQL(", ").join(
                sql.SQL("{c} {t}").format(
                    c=sql.Identifier(c), t=sql.SQL(STAGE_TYPES.get(kind_args(k)[0], "text"))
                )
                for c, k in zip(self.columns, schema.kinds, strict=True)
            )
            self.conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {stage} ({typed})").format(
                    stage=self.stage, typed=typed
                )
            )
        else:
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {stage} AS SELECT {cols} FROM {t} WITH NO DATA"
                ).format(stage=self.stage, cols=self.cols, t=self.table)
            )
        # A stage left by an earlier job whose table had other columns (RECREATE_SCHEMA):
        # the new ones come as text, cast to the target's types when committed.
        for column in (c for c in self.columns if present and c not in present):
            self.conn.execute(
                sql.SQL("ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS {c} text").format(
                    stage=self.stage, c=sql.Identifier(column)
                )
            )
        for ddl in (
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_writer text",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_checkpoint bigint",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_seq bigserial",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_mark boolean NOT NULL DEFAULT false",
        ):
            self.conn.execute(sql.SQL(ddl).format(stage=self.stage))
        self.conn.commit()

    def write(self, batch) -> None:
        if self.bulk is None:
            return super().write(batch)
        self.bulk.write(batch)

    def write_rows(self, rows: list[tuple]) -> None:
        with self.conn.cursor() as cur, cur.copy(self.copy) as copy:
            for row in rows:
                copy.write_row((*self.fit(row), self.writer))
        self.conn.commit()

    def prepare_commit(self, checkpoint_id: int) -> dict:
        """Mark the cut: one row (``keel_mark``) whose ``keel_seq`` is above every row this
        writer staged before the barrier (each batch was committed) and below every later
        one. The rows themselves are never rewritten."""
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {stage} (keel_writer, keel_checkpoint, keel_mark) "
                "VALUES (%s, %s, true)"
            ).format(stage=self.stage),
            (self.writer, checkpoint_id),
        )
        self.conn.commit()
        return {"writer": self.writer, "checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        self._commit_upto(state["checkpoint"])

    def _commit_upto(self, checkpoint_id: int | None, include_untagged: bool = False) -> None:
        if checkpoint_id is None:
            checkpoint_id = 2**62 if include_untagged else -1
        writer, upto = sql.Literal(self.writer), sql.Literal(checkpoint_id)
        if include_untagged:
            rows = sql.SQL("keel_writer = {w} AND keel_mark IS NOT TRUE").format(w=writer)
            marks = sql.SQL("keel_writer = {w} AND keel_mark").format(w=writer)
        else:
            # A row is checkpoint N's if staged before N's mark (or, staged by an older
            # version, tagged with N).
            rows = sql.SQL(
                "keel_writer = {w} AND keel_mark IS NOT TRUE AND (keel_checkpoint <= {n} OR "
                "keel_checkpoint IS NULL AND keel_seq < coalesce((SELECT max(keel_seq) FROM "
                "{stage} WHERE keel_writer = {w} AND keel_mark AND keel_checkpoint <= {n}), 0))"
            ).format(w=writer, n=upto, stage=self.stage)
            marks = sql.SQL("keel_writer = {w} AND keel_mark AND keel_checkpoint <= {n}").format(
                w=writer, n=upto
            )
        where = rows
        with self.conn.cursor() as cur:
            # One commit of this writer's rows at a time (a fenced attempt may still be
            # committing): the second sees the rows the first moved as gone.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-commit:{self.writer}",)
            )
            if self.custom:
                cur.execute(
                    sql.SQL("SELECT {cols} FROM {stage} WHERE {w} ORDER BY keel_seq").format(
                        cols=self.cols, stage=self.stage, w=where
                    )
                )
                cur.executemany(self.custom, cur.fetchall())
            else:
                cur.execute(
                    _insert_from(
                        self.table,
                        self.cols,
                        self.stage,
                        where,
                        sql.Identifier("keel_seq"),
                        self.columns,
                        self.keys,
                        self.casts,
                    )
                )
            cur.execute(
                sql.SQL("DELETE FROM {stage} WHERE {rows} OR {marks}").format(
                    stage=self.stage, rows=rows, marks=marks
                )
            )
        self.conn.commit()

    def close(self) -> None:
        """A batch pipeline finished: everything it wrote becomes visible."""
        self._commit_upto(None, include_untagged=True)
        self.abort()

    def abort(self) -> None:
        try:
            if self.bulk is not None:
                self.bulk.close()
        finally:
            self.conn.close()
