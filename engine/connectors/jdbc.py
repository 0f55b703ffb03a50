"""Jdbc source and sink for PostgreSQL.

The source splits a table by ranges of an integer partition column (the primary key by default)
and streams each range with a server-side cursor. The sink writes each batch with COPY into a
temporary table and one ``INSERT ... ON CONFLICT (primary_keys) DO UPDATE``: an upsert, so a
replayed batch changes nothing.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from engine.connectors.base import Option, SinkPlugin, SinkWriter, SourcePlugin
from engine.connectors.registry import register
from engine.connectors.schema import Schema

PG_TYPES = {
    "smallint": "int",
    "integer": "int",
    "bigint": "bigint",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "double precision": "double",
    "real": "float",
    "numeric": "decimal",
    "boolean": "boolean",
    "date": "string",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamp",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
}
INTEGER_TYPES = ("smallint", "integer", "bigint")


def connect(config: dict, **kwargs) -> psycopg.Connection:
    url = config["url"]
    if url.startswith("jdbc:"):
        url = url[len("jdbc:") :]
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValueError("only PostgreSQL URLs are supported (jdbc:postgresql://host:port/db)")
    return psycopg.connect(
        url,
        user=config.get("user") or None,
        password=config.get("password") or None,
        connect_timeout=5,
        application_name="keel-jdbc",
        **kwargs,
    )


def split_table(name: str) -> tuple[str, str]:
    schema, _, table = name.rpartition(".")
    return schema or "public", table


def table_columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    schema, name = split_table(table)
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, name),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    schema, name = split_table(table)
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass
           AND i.indisprimary
        """,
        (schema, name),
    ).fetchall()
    return [r[0] for r in rows]


def _table_ident(table: str) -> sql.Identifier:
    schema, name = split_table(table)
    return sql.Identifier(schema, name)


def _check_connection(config: dict) -> list[tuple[str, str]]:
    try:
        with connect(config) as conn:
            columns = table_columns(conn, config["table"])
    except ValueError as exc:
        return [("url", str(exc))]
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or ["error"])[0]
        return [("url", f"cannot connect: {reason}")]
    if not columns:
        return [("table", f"no table {config['table']!r} in that database")]
    return []


COMMON = (
    Option("url", str, required=True, help="jdbc:postgresql://host:port/database"),
    Option("user", str, default=""),
    Option("password", str, default=""),
    Option("table", str, required=True),
)


@register
class JdbcSource(SourcePlugin):
    name = "Jdbc"
    options = (
        *COMMON,
        Option(
            "partition_column",
            str,
            default="",
            help="integer column to split by (default: the primary key)",
        ),
        Option("split.num", int, default=4, min=1),
        Option("fetch_size", int, default=1000, min=1),
    )

    @classmethod
    def check(cls, config):
        errors = _check_connection(config)
        if errors:
            return errors
        with connect(config) as conn:
            types = dict(table_columns(conn, config["table"]))
            column = config["partition_column"] or next(
                iter(primary_key(conn, config["table"])), ""
            )
        if not column:
            return [("partition_column", "the table has no primary key: name a column")]
        if types.get(column) not in INTEGER_TYPES:
            return [("partition_column", f"{column!r} must be an integer column of the table")]
        unknown = [c for c, t in types.items() if t not in PG_TYPES]
        if unknown:
            return [("table", f"unsupported column type(s): {', '.join(unknown)}")]
        return []

    def _column(self, conn) -> str:
        return self.config["partition_column"] or primary_key(conn, self.config["table"])[0]

    def output_schema(self) -> Schema:
        with connect(self.config) as conn:
            return Schema(
                tuple((c, PG_TYPES[t]) for c, t in table_columns(conn, self.config["table"]))
            )

    def create_splits(self, mode: str) -> list[dict]:
        """Contiguous ranges of the partition column, plus one split for its NULLs."""
        table = _table_ident(self.config["table"])
        with connect(self.config) as conn:
            column = self._column(conn)
            order = [column, *[k for k in primary_key(conn, self.config["table"]) if k != column]]
            low, high, nulls = conn.execute(
                sql.SQL(
                    "SELECT min({c}), max({c}), count(*) FILTER (WHERE {c} IS NULL) FROM {t}"
                ).format(c=sql.Identifier(column), t=table)
            ).fetchone()
        base = {"column": column, "order": order}
        splits = []
        if low is not None:
            count = self.config["split.num"]
            step = max((high - low + 1) // count, 1)
            start = low
            while start <= high:
                end = high + 1 if len(splits) == count - 1 else min(start + step, high + 1)
                splits.append(
                    {**base, "splitId": f"range-{start}-{end}", "low": start, "high": end}
                )
                start = end
        if nulls:
            splits.append({**base, "splitId": "nulls", "low": None, "high": None})
        return splits

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Rows of the split in a total order (partition column, then the primary key), so a
        resume from ``offset`` rows is exact."""
        column = sql.Identifier(split["column"])
        if split["low"] is None:
            where, params = sql.SQL("{c} IS NULL").format(c=column), []
        else:
            where = sql.SQL("{c} >= %s AND {c} < %s").format(c=column)
            params = [split["low"], split["high"]]
        order = sql.SQL(", ").join(sql.Identifier(c) for c in split.get("order", [split["column"]]))
        query = sql.SQL("SELECT * FROM {t} WHERE {w} ORDER BY {o} OFFSET %s").format(
            t=_table_ident(self.config["table"]), w=where, o=order
        )
        with connect(self.config) as conn, conn.transaction():
            with conn.cursor(name="keel_jdbc_source") as cur:
                cur.itersize = self.config["fetch_size"]
                cur.execute(query, [*params, offset])
                while True:
                    rows = cur.fetchmany(batch_size)
                    if not rows:
                        return
                    offset += len(rows)
                    yield [tuple(r) for r in rows], offset


def _insert_from(
    table: sql.Composable,
    cols: sql.Composable,
    source: sql.Composable,
    where: sql.Composable,
    order: sql.Composable,
    columns: list[str],
    keys: list[str],
) -> sql.Composed:
    """INSERT INTO table SELECT ... FROM source: an upsert on ``keys`` (the last row of a key
    wins), or a plain insert without keys."""
    if not keys:
        return sql.SQL("INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} WHERE {w}").format(
            t=table, cols=cols, s=source, w=where
        )
    key_list = sql.SQL(", ").join(sql.Identifier(k) for k in keys)
    query = sql.SQL(
        "INSERT INTO {t} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {s} WHERE {w} "
        "ORDER BY {keys}, {o} DESC ON CONFLICT ({keys}) "
    ).format(t=table, cols=cols, keys=key_list, s=source, w=where, o=order)
    updates = [c for c in columns if c not in keys]
    if not updates:
        return query + sql.SQL("DO NOTHING")
    return (
        query
        + sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in updates
        )
    )


class JdbcWriter(SinkWriter):
    """At-least-once writer (no checkpoints): each batch is COPYed into a temporary table and
    upserted (or inserted) at once."""

    def __init__(self, config: dict, schema: Schema) -> None:
        self.conn = connect(config, autocommit=False)
        self.columns = schema.names
        table = _table_ident(config["table"])
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        self.conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE keel_stage ON COMMIT DELETE ROWS AS "
                "SELECT {cols} FROM {t} WITH NO DATA"
            ).format(cols=cols, t=table)
        )
        self.conn.commit()
        self.upsert = _insert_from(
            table,
            cols,
            sql.Identifier("keel_stage"),
            sql.SQL("true"),
            sql.SQL("ctid"),
            self.columns,
            config["primary_keys"] or [],
        )
        self.copy = sql.SQL("COPY keel_stage ({cols}) FROM STDIN").format(cols=cols)

    def write(self, rows: list[tuple]) -> None:
        with self.conn.cursor() as cur:
            with cur.copy(self.copy) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(self.upsert)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def abort(self) -> None:
        self.conn.close()


class ExactlyOnceJdbcWriter(SinkWriter):
    """Exactly-once writer for checkpointed jobs.

    Rows go to a durable staging table ``<table>__keel_stage`` tagged with this writer's stable
    key (job, pipeline, reader: the same for every attempt). At barrier N the untagged rows are
    tagged N (pre-commit); when N completes they move to the target in one transaction and leave
    the stage, so committing N twice changes nothing. A new attempt first finishes the commit of
    the checkpoint it restores from, then drops every later staged row: those rows are replayed.
    """

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.conn = connect(config, autocommit=False)
        self.columns = schema.names
        self.keys = config["primary_keys"] or []
        schema_name, name = split_table(config["table"])
        self.table = sql.Identifier(schema_name, name)
        self.stage = sql.Identifier(schema_name, f"{name}__keel_stage")
        self.cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        self.writer = (
            f"{context.get('jobId')}-{context.get('pipelineId')}-{context.get('readerIndex')}"
        )
        # Readers of one job open their writers at the same moment: serialise the DDL (two
        # concurrent CREATE TABLE IF NOT EXISTS can both try to create the table).
        self.conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-stage:{schema_name}.{name}",)
        )
        self.conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {stage} AS SELECT {cols} FROM {t} WITH NO DATA"
            ).format(stage=self.stage, cols=self.cols, t=self.table)
        )
        for ddl in (
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_writer text",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_checkpoint bigint",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_seq bigserial",
        ):
            self.conn.execute(sql.SQL(ddl).format(stage=self.stage))
        self.conn.commit()
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

    def write(self, rows: list[tuple]) -> None:
        with self.conn.cursor() as cur, cur.copy(self.copy) as copy:
            for row in rows:
                copy.write_row((*row, self.writer))
        self.conn.commit()

    def prepare_commit(self, checkpoint_id: int) -> dict:
        self.conn.execute(
            sql.SQL(
                "UPDATE {stage} SET keel_checkpoint = %s WHERE keel_writer = %s "
                "AND keel_checkpoint IS NULL"
            ).format(stage=self.stage),
            (checkpoint_id, self.writer),
        )
        self.conn.commit()
        return {"writer": self.writer, "checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        self._commit_upto(state["checkpoint"])

    def _commit_upto(self, checkpoint_id: int | None, include_untagged: bool = False) -> None:
        if checkpoint_id is None:
            checkpoint_id = 2**62 if include_untagged else -1
        where = sql.SQL("keel_writer = {w} AND (keel_checkpoint <= {n}{untagged})").format(
            w=sql.Literal(self.writer),
            n=sql.Literal(checkpoint_id),
            untagged=sql.SQL(" OR keel_checkpoint IS NULL" if include_untagged else ""),
        )
        with self.conn.cursor() as cur:
            # One commit of this writer's rows at a time (a fenced attempt may still be
            # committing): the second sees the rows the first moved as gone.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-commit:{self.writer}",)
            )
            cur.execute(
                _insert_from(
                    self.table,
                    self.cols,
                    self.stage,
                    where,
                    sql.Identifier("keel_seq"),
                    self.columns,
                    self.keys,
                )
            )
            cur.execute(sql.SQL("DELETE FROM {stage} WHERE {w}").format(stage=self.stage, w=where))
        self.conn.commit()

    def close(self) -> None:
        """A batch pipeline finished: everything it wrote becomes visible."""
        self._commit_upto(None, include_untagged=True)
        self.conn.close()

    def abort(self) -> None:
        self.conn.close()


@register
class JdbcSink(SinkPlugin):
    name = "Jdbc"
    options = (
        *COMMON,
        Option(
            "primary_keys",
            list,
            default=None,
            help="upsert on these columns (idempotent); without them, plain insert",
        ),
    )

    @classmethod
    def check(cls, config):
        errors = _check_connection(config)
        if errors:
            return errors
        keys = config["primary_keys"]
        if keys is not None and (not keys or not all(isinstance(k, str) for k in keys)):
            return [("primary_keys", "must be a non-empty list of column names")]
        with connect(config) as conn:
            columns = {c for c, _ in table_columns(conn, config["table"])}
        missing = [k for k in keys or [] if k not in columns]
        if missing:
            return [("primary_keys", f"not columns of {config['table']}: {', '.join(missing)}")]
        return []

    def input_errors(self, schema: Schema) -> list[tuple[str, str]]:
        with connect(self.config) as conn:
            columns = {c for c, _ in table_columns(conn, self.config["table"])}
        missing = [n for n in schema.names if n not in columns]
        if missing:
            return [
                (
                    "table",
                    f"{self.config['table']} has no column(s) {', '.join(missing)} "
                    "for the incoming fields",
                )
            ]
        return []

    def writer(self, schema: Schema, context: dict) -> SinkWriter:
        if context.get("checkpointing"):
            return ExactlyOnceJdbcWriter(self.config, schema, context)
        return JdbcWriter(self.config, schema)
