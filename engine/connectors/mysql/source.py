"""The Jdbc source on MySQL and MariaDB: a table's or a query's columns and Keel types, splits
by ranges of a column (the PostgreSQL source's rule: an integer column's bounds set the
stride, never filter rows; another type is cut at its quantiles; NULLs are a split of their
own), and a split read as Arrow batches from a streaming cursor (bounded memory: the server
sends rows as they are fetched)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pymysql

from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import bounded, limits
from engine.connectors.jdbc_splits import plan_splits, plan_value_splits
from engine.connectors.mysql.sessions import connect, quote, text
from engine.connectors.mysql.types import INTEGER_TYPES, batch_of, field_column_type, keel_kind
from engine.connectors.mysql.types import parse_column_type as parse_type
from engine.connectors.schema import Schema

#: MySQL's way to say "no limit" beside an OFFSET.
NO_LIMIT = "18446744073709551615"


def split_table(config: dict, table: str) -> tuple[str, str]:
    """``db.table`` or ``table`` (the URL's database)."""
    database, _, name = table.rpartition(".")
    return database or connect_database(config), name


def connect_database(config: dict) -> str:
    from engine.connectors.mysql.sessions import target

    return target(config)[0].database


def table_columns(conn, database: str, table: str) -> list[tuple[str, str]]:
    """(name, COLUMN_TYPE) of a table's columns in order; empty when there is no table."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE "
            "TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        return [(text(n), text(t)) for n, t in cur.fetchall()]


def primary_key(conn, database: str, table: str) -> list[str]:
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s"
            " AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        return [text(r[0]) for r in cur.fetchall()]


def rows_of(config: dict) -> str:
    """What a source reads, as ``... AS keel_query``: its query, its table's rows that match
    ``where_condition``, or its table."""
    if config.get("query"):
        return f"({config['query'].strip().rstrip(';')}) AS keel_query"
    table = quote(config["table"])
    if config.get("where_condition"):
        condition = config["where_condition"].strip().rstrip(";")
        return f"(SELECT * FROM {table} WHERE {condition}) AS keel_query"
    return f"{table} AS keel_query"


def query_columns(conn, rows: str) -> list[tuple[str, str]]:
    """(name, type) of the columns of ``rows`` from the result's metadata (no row read)."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT * FROM {rows} LIMIT 0")
        fields = cur._result.fields  # PyMySQL's Field: type code, flags, length, charset
    conn.rollback()
    return [(f.name, field_column_type(f)) for f in fields]


def columns(conn, config: dict) -> list[tuple[str, str, str]]:
    """(name, MySQL type, Keel kind) of every column the source reads; ValueError names a
    column whose type Keel does not carry."""
    tiny_bit = conn.url.tiny_int1_is_bit
    if config.get("query") or config.get("where_condition"):
        typed = query_columns(conn, rows_of(config))
    else:
        typed = table_columns(conn, *split_table(config, config["table"]))
    out, unknown = [], []
    for name, column_type in typed:
        try:
            out.append((name, column_type, keel_kind(column_type, tiny_bit)))
        except ValueError:
            unknown.append(f"{name} ({column_type})")
    if unknown:
        raise ValueError(f"unsupported type of: {', '.join(unknown)}")
    return out


def output_schema(config: dict) -> Schema:
    with connect(config, read_only=True) as conn:
        return Schema(tuple((name, kind) for name, _, kind in columns(conn, config)))


#: Types whose ORDER BY is not their comparison with a literal (an ENUM sorts by its
#: position in the definition, a SET by its bits, MySQL's JSON by its own rules).
UNSPLITTABLE = frozenset({"enum", "set", "json"})


def partition_column(conn, config: dict) -> tuple[str, list[str], bool]:
    """The column to split by (``partition_column``, else the table's first key column), the
    table's primary key and whether the column is an integer column (else it is cut at its
    quantiles); ValueError when the rows have no such column."""
    keys = primary_key(conn, *split_table(config, config["table"])) if config.get("table") else []
    column = config.get("partition_column") or next(iter(keys), "")
    if not column:
        return column, keys, False
    types = {name: column_type for name, column_type, _ in columns(conn, config)}
    if column not in types:
        raise ValueError(f"{column!r} is not a column of the rows")
    base = parse_type(types[column])[0]
    if base in UNSPLITTABLE:
        raise ValueError(
            f"{column!r} is {base}: MySQL orders it otherwise than it compares it with a "
            "value, so its ranges would overlap; name another partition_column"
        )
    return column, keys, base in INTEGER_TYPES


def create_splits(config: dict) -> list[dict]:
    """The source's splits (engine.connectors.jdbc_splits.plan_splits: ranges of the partition
    column, of ``split.num`` or of ``split.size`` rows, plus one for its NULLs); one split when
    there is no partition column (a query without one)."""
    with connect(config, read_only=True) as conn:
        column, keys, integer = partition_column(conn, config)
        if not column:
            return [{"splitId": "all", "column": None, "low": None, "high": None, "total": False}]
        c = quote(column)
        if not integer:
            return _value_splits(conn, config, column, keys)
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(
                f"SELECT min({c}), max({c}), count(*) - count({c}), count({c})"
                f" FROM {rows_of(config)}"
            )
            low, high, nulls, count = (text(v) for v in cur.fetchone())

        def quantiles(step: int, probability: float | None) -> list[int]:
            return [int(text(v)) for v in _quantiles(conn, config, column, step, probability)]

        stats = (low, high, int(nulls), int(count))
        splits = plan_splits(config, column, keys, stats, quantiles)
        conn.rollback()
    return splits


def _quantiles(conn, config: dict, column: str, step: int, probability: float | None) -> list:
    """Every ``step``-th non-null value of ``column`` in order (of a sample of its rows with
    ``probability``), as the session read them."""
    c = quote(column)
    sample = f"RAND() < {float(probability)}" if probability else "TRUE"
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            f"SELECT v FROM (SELECT {c} AS v, ROW_NUMBER() OVER (ORDER BY {c}) AS n"
            f" FROM {rows_of(config)} WHERE {c} IS NOT NULL AND {sample}) AS keel_keys"
            f" WHERE n % {int(step)} = 0 ORDER BY n"
        )
        return [v for (v,) in cur.fetchall()]


def _value_splits(conn, config: dict, column: str, keys: list[str]) -> list[dict]:
    """Ranges between the quantiles of a column that is not an integer, each bound the
    literal of a value (its text, or a binary string's bytes) as the session writes it."""
    c = quote(column)
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT count(*) - count({c}), count({c}) FROM {rows_of(config)}")
        counts = tuple(int(text(v)) for v in cur.fetchone())

    def quantiles(step: int, probability: float | None) -> list[str]:
        return [conn.escape(v) for v in _quantiles(conn, config, column, step, probability)]

    splits = plan_value_splits(config, column, keys, counts, quantiles)
    conn.rollback()
    return splits


def split_query(config: dict, split: dict, names: list[str], offset: int) -> str:
    """The statement that reads a split from ``offset`` in a total order (the partition
    column, then the primary key; without a key, every column)."""
    column = quote(split["column"]) if split.get("column") else None
    if column is None:
        where = ["TRUE"]
    elif split["low"] is None:
        where = [f"{column} IS NULL"]
    else:
        # Integers, or a column's values as literals the session escaped (create_splits).
        value = (lambda v: str(v)) if split.get("values") else (lambda v: str(int(v)))
        where = [f"{column} IS NOT NULL"]
        if not split.get("open_low"):
            where.append(f"{column} >= {value(split['low'])}")
        if not split.get("open_high"):
            where.append(f"{column} < {value(split['high'])}")
    order = [f"keel_query.{quote(c)}" for c in split.get("order") or []]
    if not split.get("total", True):
        # No key: every column breaks ties, by its bytes (a collation may call 'a' and 'A'
        # equal); rows that are equal byte for byte are interchangeable.
        order += [f"CAST(keel_query.{quote(n)} AS BINARY)" for n in names]
    cols = ", ".join(f"keel_query.{quote(n)}" for n in names)
    return (
        f"SELECT {cols} FROM {rows_of(config)} WHERE {' AND '.join(where)}"
        f" ORDER BY {', '.join(order) or '1'} LIMIT {NO_LIMIT} OFFSET {int(offset)}"
    )


def read_split(
    config: dict, split: dict, offset: int, batch_size: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Yield ``(batch, next_offset)``: the split's rows from ``offset`` as Arrow batches of at
    most ``batch_size`` rows (and about engine.dataplane.batch-bytes), fetched from a
    streaming cursor in a read-only transaction."""
    _, max_bytes = limits()
    conn = connect(config, read_only=True, streaming=True)
    try:
        typed = columns(conn, config)
        target = arrow_schema(Schema(tuple((n, k) for n, _, k in typed)))
        statement = split_query(config, split, [n for n, _, _ in typed], offset)
        cur = conn.cursor()
        cur.execute(statement)
        while rows := cur.fetchmany(batch_size):
            batch = batch_of(rows, typed).cast(target)
            for part in bounded(batch, batch_size, max_bytes):
                offset += part.num_rows
                yield part, offset
        cur.close()
    finally:
        # Closed mid-split (a cancel, a failure): the socket closes; the rest is never read.
        conn.close()
