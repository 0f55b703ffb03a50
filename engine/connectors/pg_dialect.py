"""PostgreSQL as a Jdbc dialect: a source's columns and types, its splits (ranges of its
partition column) and reads (ADBC's binary COPY of the split's query, straight into Arrow),
and the sink's table, save modes and writers (engine.connectors.jdbc_writers,
jdbc_prepared)."""

from __future__ import annotations

from functools import partial

import psycopg
from psycopg import sql

from engine.connectors import pg_arrow
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.base import SinkWriter
from engine.connectors.batches import bounded, limits
from engine.connectors.jdbc_checks import pg_connection_errors
from engine.connectors.jdbc_dialect import Dialect
from engine.connectors.jdbc_prepared import open_prepared_writer
from engine.connectors.jdbc_savemodes import add_columns, apply_save_modes
from engine.connectors.jdbc_splits import bound_errors, plan_splits, plan_value_splits
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter, JdbcWriter
from engine.connectors.pg import (
    INTEGER_TYPE_NAMES,
    INTEGER_TYPES,
    PG_TYPE_NAMES,
    PG_TYPES,
    connect,
    connect_read_only,
    database_name,
    primary_key,
    query_columns,
    split_table,
    table_columns,
    table_ident,
    url_notes,
    user_sql,
)
from engine.connectors.pg_arrow import select_list
from engine.connectors.schema import Schema

#: A source session's transactions are read-only, whatever its query says; dates are read
#: as ISO text, whatever the server's DateStyle.
READ_ONLY = "-c default_transaction_read_only=on -c DateStyle=ISO -c TimeZone=UTC"


def rows_of(config: dict, parameters: bool = True) -> sql.Composable:
    """What a Jdbc source reads, as ``... AS keel_query``: its query, its table's rows that
    match ``where_condition``, or its table. ``parameters``: the statement it goes into also
    takes parameters (then a ``%`` of the job's SQL is written ``%%``)."""
    text = user_sql if parameters else (lambda t: sql.SQL(t.strip().rstrip(";")))
    if config.get("query"):
        rows = sql.SQL("({q})").format(q=text(config["query"]))
    else:
        rows = table_ident(config["table"])
    if config.get("where_condition"):
        return sql.SQL("(SELECT * FROM {r} AS keel_rows WHERE {w}) AS keel_query").format(
            r=rows, w=text(config["where_condition"])
        )
    return sql.SQL("{r} AS keel_query").format(r=rows)


def _columns(conn, config: dict) -> list[tuple[str, str]]:
    if config["query"] or config.get("where_condition"):
        return query_columns(conn, rows_of(config))
    return table_columns(conn, config["table"])


def _keys(conn, config: dict, types: dict[str, str]) -> list[str]:
    """The table's primary key, when the rows read carry all of it (a query beside its
    table may leave it out)."""
    keys = primary_key(conn, config["table"]) if config["table"] else []
    return keys if all(k in types for k in keys) else []


def _orderable(conn, config: dict, column: str) -> list[tuple[str, str]]:
    """Whether the partition column has an order (json, xml, point have none)."""
    try:
        conn.execute(
            sql.SQL("SELECT {c} FROM {rows} WHERE %s ORDER BY {c} LIMIT 0").format(
                c=sql.Identifier(column), rows=rows_of(config)
            ),
            (True,),
        )
    except psycopg.Error as exc:
        conn.rollback()
        reason = (str(exc).strip().splitlines() or ["error"])[0]
        return [("partition_column", f"{column!r} cannot be ordered: {reason}")]
    conn.rollback()
    return []


def _quantiles(conn, config: dict, column: str, step: int, probability: float | None, text: bool):
    """Every ``step``-th non-null value of ``column`` in order (of a sample of its rows with
    ``probability``): integers, or (``text``) the values' text, which a read compares the
    column with as an untyped literal (parsed as the column's type)."""
    c = sql.Identifier(column)
    sample = sql.SQL("random() < {p}").format(p=sql.Literal(probability))
    query = sql.SQL(
        "SELECT {v} FROM (SELECT {c} AS v, row_number() OVER (ORDER BY {c}) AS n FROM {rows}"
        " WHERE {c} IS NOT NULL AND {sample} AND %s) AS keel_keys WHERE n %% {step} = 0"
        " ORDER BY keel_keys.v"
    ).format(
        v=sql.SQL("v::text" if text else "DISTINCT v"),
        c=c,
        rows=rows_of(config),
        sample=sample if probability else sql.SQL("true"),
        step=sql.Literal(step),
    )
    values = [r[0] for r in conn.execute(query, (True,)).fetchall()]
    return values if text else [int(v) for v in values]


def _typed(conn, config: dict) -> list[tuple[str, str, str]]:
    """(name, PostgreSQL type, Keel kind) of each column read. A ``numeric`` is an exact
    ``decimal(p, s)``: its own precision and scale, or SeaTunnel's ``decimal(38, 18)`` for a
    numeric without them (or wider than 38 digits). A type without a Keel mapping (xml,
    inet, interval, an enum, an array, ...) is a string: its text, as SeaTunnel reads most."""
    columns = _columns(conn, config)
    shapes = {}
    if any(t == "numeric" for _, t in columns):
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT * FROM {rows} LIMIT %s").format(rows=rows_of(config)), (0,))
            shapes = {d.name: (d.precision, d.scale) for d in cur.description}
        conn.rollback()
    out = []
    for name, pg_type in columns:
        kind = PG_TYPES.get(pg_type) or PG_TYPE_NAMES.get(pg_type) or "string"
        if pg_type == "numeric":
            precision, scale = shapes.get(name) or (None, None)
            if not precision or precision > 38:
                precision, scale = 38, 18
            kind = f"decimal({precision}, {scale or 0})"
        out.append((name, pg_type, kind))
    return out


class PostgresDialect(Dialect):
    name = "PostgreSQL"
    errors = (psycopg.Error,)

    def notes(self, config: dict) -> list[tuple[str, str]]:
        return url_notes(config)

    def connection_errors(self, config, table_required, missing_ok):
        return pg_connection_errors(config, table_required, missing_ok)

    def placeholder_names(self, config: dict) -> dict[str, str]:
        """``database.schema.table``: its table (the url's database when the path names
        none)."""
        schema, table = split_table(config["table"])
        try:
            database = config.get("database") or database_name(config)
        except ValueError:
            database = ""
        full = ".".join(p for p in (database, schema, table) if p)
        return {
            "${database_name}": database,
            "${schema_name}": schema,
            "${table_name}": table,
            "${table_full_name}": full,
        }

    def source_errors(self, config: dict) -> list[tuple[str, str]]:
        """The rows can be read, and split by their partition column (any column PostgreSQL
        can order); a column of a type without a Keel mapping is read as its text."""
        try:
            with connect_read_only(config) as conn:
                types = dict(_columns(conn, config))
                keys = _keys(conn, config, types)
                column = config["partition_column"] or next(iter(keys), "")
                if column and column not in types:
                    return [("partition_column", f"{column!r} is not a column of the rows")]
                integer = types.get(column) in INTEGER_TYPE_NAMES + INTEGER_TYPES
                errors = bound_errors(config, column, integer)
                if column and not errors:
                    errors = _orderable(conn, config, column)
                return errors
        except psycopg.Error as exc:
            reason = (str(exc).strip().splitlines() or ["error"])[0]
            return [("query" if config["query"] else "where_condition", reason)]

    def output_schema(self, config: dict) -> Schema:
        with connect_read_only(config) as conn:
            typed = _typed(conn, config)
        return Schema(tuple((name, kind) for name, _, kind in typed))

    def create_splits(self, config: dict) -> list[dict]:
        """Contiguous ranges of the partition column (engine.connectors.jdbc_splits), plus
        one split for its NULLs; a query without a partition column is one split."""
        with connect_read_only(config) as conn:
            keys = _keys(conn, config, dict(_columns(conn, config)))
            column = config["partition_column"] or next(iter(keys), "")
            if not column:
                return [
                    {
                        "splitId": "all",
                        "column": None,
                        "low": None,
                        "high": None,
                        "total": False,
                        "byteOrder": True,
                    }
                ]
            c = sql.Identifier(column)
            if dict(_columns(conn, config)).get(column) not in INTEGER_TYPE_NAMES + INTEGER_TYPES:
                counts = conn.execute(
                    sql.SQL("SELECT count(*) - count({c}), count({c}) FROM {t} WHERE %s").format(
                        c=c, t=rows_of(config)
                    ),
                    (True,),
                ).fetchone()
                values = partial(_quantiles, conn, config, column, text=True)
                return plan_value_splits(config, column, keys, counts, values)
            stats = conn.execute(
                sql.SQL(
                    "SELECT min({c}), max({c}), count(*) FILTER (WHERE {c} IS NULL),"
                    " count({c}) FROM {t} WHERE %s"
                ).format(c=c, t=rows_of(config)),
                (True,),  # a parameter: the extended protocol, one statement only
            ).fetchone()
            quantiles = partial(_quantiles, conn, config, column, text=False)
            return plan_splits(config, column, keys, stats, quantiles)

    def read(self, config: dict, split: dict, offset: int, batch_size: int):
        """Rows of the split in a total order (partition column, then the primary key; a
        query without either: every column), so a resume from ``offset`` rows is exact. Read
        with ADBC (binary COPY of the query) straight into Arrow batches."""
        column = sql.Identifier(split["column"]) if split["column"] else None
        if column is None:
            where = sql.SQL("true")
        elif split["low"] is None:
            where = sql.SQL("{c} IS NULL").format(c=column)
        else:
            # Bounds are integers the engine made (or a column's values as text, untyped
            # literals PostgreSQL parses as the column's type), written as literals: ADBC
            # reads a query with COPY, which takes no parameters (and one statement only).
            value = str if split.get("values") else int
            bounds = []
            if not split.get("open_low"):
                bounds.append(
                    sql.SQL("{c} >= {v}").format(c=column, v=sql.Literal(value(split["low"])))
                )
            if not split.get("open_high"):
                bounds.append(
                    sql.SQL("{c} < {v}").format(c=column, v=sql.Literal(value(split["high"])))
                )
            bounds.append(sql.SQL("{c} IS NOT NULL").format(c=column))
            where = sql.SQL(" AND ").join(bounds)
        order = [
            sql.SQL("keel_query.{c}").format(c=sql.Identifier(c)) for c in split.get("order") or []
        ]
        if not split.get("total", True):
            # No primary key in the order: the row's text breaks ties, byte by byte (rows of
            # the same text are the same values, interchangeable).
            # A split made before byte order keeps its collation's order, so a restore from
            # its checkpoint resumes at the same row.
            collate = ' COLLATE "C"' if split.get("byteOrder") else ""
            order.append(sql.SQL("keel_query::text" + collate))
        with connect_read_only(config) as conn:
            typed = _typed(conn, config)
            query = (
                sql.SQL("SELECT {cols} FROM {t} WHERE {w} ORDER BY {o} OFFSET {n}")
                .format(
                    cols=select_list(typed),
                    t=rows_of(config, parameters=False),
                    w=where,
                    o=sql.SQL(", ").join(order),
                    n=sql.Literal(int(offset)),
                )
                .as_string(conn)
            )
        target = arrow_schema(Schema(tuple((name, kind) for name, _, kind in typed)))
        _, max_bytes = limits()
        with pg_arrow.connect(config, "keel-jdbc", READ_ONLY) as adbc, adbc.cursor() as cur:
            cur.adbc_statement.set_options(
                **{"adbc.postgresql.batch_size_hint_bytes": str(max_bytes)}
            )
            cur.execute(query)
            for batch in cur.fetch_record_batch():
                for part in bounded(batch, batch_size, max_bytes):
                    offset += part.num_rows
                    yield part.cast(target), offset

    def table_columns(self, config: dict) -> set[str]:
        with connect(config) as conn:
            return {c for c, _ in table_columns(conn, config["table"])}

    def apply_save_modes(self, config: dict, schema: Schema | None) -> list[str]:
        return apply_save_modes(config, schema)

    def add_columns(self, config: dict, added: list[tuple[str, str]]) -> None:
        add_columns(config, added)

    def writer(self, config: dict, schema: Schema, context: dict) -> SinkWriter:
        """Checkpointed: two-phase commit with prepared transactions when is_exactly_once
        asks and the target allows, else the staging table; else at least once."""
        if context.get("checkpointing"):
            if config.get("is_exactly_once"):
                writer = open_prepared_writer(config, schema, context)
                if writer is not None:
                    return writer
            return ExactlyOnceJdbcWriter(config, schema, context)
        return JdbcWriter(config, schema, context)
