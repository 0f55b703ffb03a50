"""Jdbc source and sink for PostgreSQL.

The source splits a table by ranges of an integer partition column (the primary key by default)
and streams each range with a server-side cursor. The sink's writers (engine.connectors
.jdbc_writers) COPY each batch into a staging table and move it with one ``INSERT ... SELECT``:
an upsert on ``primary_keys`` (a replayed batch changes nothing), or exactly once through
checkpoints.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from engine.connectors.base import Option, SinkPlugin, SinkWriter, SourcePlugin
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter, JdbcWriter
from engine.connectors.pg import (
    INTEGER_TYPES,
    PG_TYPES,
    connect,
    primary_key,
    table_columns,
    table_ident,
)
from engine.connectors.registry import register
from engine.connectors.schema import Schema

#: The only JDBC driver Keel speaks for: configs written for SeaTunnel name it.
POSTGRES_DRIVER = "org.postgresql.Driver"


def _check_connection(config: dict) -> list[tuple[str, str]]:
    if config.get("driver", POSTGRES_DRIVER) != POSTGRES_DRIVER:
        return [("driver", f"only PostgreSQL is supported (driver = {POSTGRES_DRIVER})")]
    if config.get("connection") and (config.get("url") or config.get("password")):
        return [("connection", "give either a named connection or url/user/password, not both")]
    try:
        with connect(config) as conn:
            columns = table_columns(conn, config["table"])
    except ValueError as exc:
        return [("connection" if config.get("connection") else "url", str(exc))]
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or ["error"])[0]
        return [("url", f"cannot connect: {reason}")]
    if not columns:
        return [("table", f"no table {config['table']!r} in that database")]
    return []


COMMON = (
    Option("url", str, default="", help="jdbc:postgresql://host:port/database"),
    Option("user", str, default=""),
    Option("password", str, default=""),
    Option(
        "connection",
        str,
        default="",
        help="a named connection (url, user and password an admin stored) instead",
    ),
    Option("table", str, required=True),
    Option("driver", str, default=POSTGRES_DRIVER, help=f"{POSTGRES_DRIVER} (the only one)"),
)


@register
class JdbcSource(SourcePlugin):
    name = "Jdbc"
    connects = True
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
        table = table_ident(self.config["table"])
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
            t=table_ident(self.config["table"]), w=where, o=order
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


@register
class JdbcSink(SinkPlugin):
    name = "Jdbc"
    connects = True
    options = (
        *COMMON,
        Option(
            "primary_keys",
            list,
            default=None,
            help="upsert on these columns (idempotent); without them, plain insert",
        ),
    )
    ignored_options = {
        "batch_size": "each batch a reader hands the sink is written with one COPY",
        "max_retries": "a failed write is retried by recovery from the last checkpoint",
    }

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
        return JdbcWriter(self.config, schema, context)
