"""Jdbc source and sink for PostgreSQL.

The source splits a table by ranges of an integer partition column (the primary key by default)
and streams each range with a server-side cursor. The sink's writers (engine.connectors
.jdbc_writers) COPY each batch into a staging table and move it with one ``INSERT ... SELECT``:
an upsert on ``primary_keys`` (a replayed batch changes nothing), or exactly once through
checkpoints.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from engine.connectors import pg_arrow
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.base import Option, SinkPlugin, SinkWriter, SourcePlugin
from engine.connectors.batches import bounded, limits
from engine.connectors.jdbc_prepared import open_prepared_writer
from engine.connectors.jdbc_statements import (
    FIELD_IDE,
    QUERY_STATEMENT,
    placeholders,
    target_columns,
)
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter, JdbcWriter
from engine.connectors.pg import (
    INTEGER_TYPE_NAMES,
    INTEGER_TYPES,
    PG_TYPE_NAMES,
    PG_TYPES,
    connect,
    connect_read_only,
    primary_key,
    query_columns,
    table_columns,
    table_ident,
    user_sql,
)
from engine.connectors.pg_arrow import select_list
from engine.connectors.registry import register
from engine.connectors.schema import Schema

#: A source query reads: anything else is refused before it reaches the database (where it
#: would meet a read-only transaction anyway).
SELECT_STATEMENT = re.compile(r"^\s*\(*\s*(select|with|values|table)\b", re.IGNORECASE)
#: The only JDBC driver Keel speaks for: configs written for SeaTunnel name it.
POSTGRES_DRIVER = "org.postgresql.Driver"


def _check_connection(config: dict, table_required: bool = True) -> list[tuple[str, str]]:
    if config.get("driver", POSTGRES_DRIVER) != POSTGRES_DRIVER:
        return [("driver", f"only PostgreSQL is supported (driver = {POSTGRES_DRIVER})")]
    if config.get("connection") and (config.get("url") or config.get("password")):
        return [("connection", "give either a named connection or url/user/password, not both")]
    if config.get("table_path"):
        error = _table_from_path(config)
        if error:
            return [error]
    try:
        with connect(config) as conn:
            columns = table_columns(conn, config["table"]) if config["table"] else []
            dbname = conn.info.dbname
    except ValueError as exc:
        return [("connection" if config.get("connection") else "url", str(exc))]
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or ["error"])[0]
        return [("url", f"cannot connect: {reason}")]
    if config.get("database") and config["database"] != dbname:
        return [("database", f"{config['database']!r} is not the url's database ({dbname!r})")]
    if config["table"] and not columns:
        return [("table", f"no table {config['table']!r} in that database")]
    if table_required and not config["table"]:
        return [("table", "is required")]
    return []


def _table_or_query(
    config: dict, has_table: bool, statement: re.Pattern, kind: str
) -> list[tuple[str, str]]:
    """Exactly one of a table and a query, and the query of the kind this side runs."""
    if bool(config["query"]) == has_table:
        return [("query", "give either table (or table_path) or query")]
    if config["query"] and not statement.match(config["query"]):
        return [("query", f"must be one {kind} statement")]
    return []


def _table_from_path(config: dict) -> tuple[str, str] | None:
    """SeaTunnel's ``table_path`` (``database.schema.table``, ``schema.table`` or ``table``)
    as ``table``; its database, if named, must be the url's."""
    parts = config["table_path"].split(".")
    if len(parts) > 3 or not all(parts):
        return ("table_path", "must be database.schema.table, schema.table or table")
    if config["table"] and config["table"] != ".".join(parts[-2:]):
        return ("table_path", f"names another table than table ({config['table']!r})")
    if len(parts) == 3:
        config["database"] = config.get("database") or parts[0]
        if config["database"] != parts[0]:
            return ("table_path", f"names database {parts[0]!r}, database says otherwise")
    config["table"] = ".".join(parts[-2:])
    return None


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
    Option("driver", str, default=POSTGRES_DRIVER, help=f"{POSTGRES_DRIVER} (the only one)"),
    Option("database", str, default="", help="must be the url's database"),
)
#: SeaTunnel's options of both sides that change nothing here.
COMMON_IGNORED = {
    "connection_check_timeout_sec": "connections time out after 5 s",
    "properties": "the url's parameters are the connection's (sslmode)",
    "compatible_mode": "PostgreSQL only",
    "dialect": "PostgreSQL only",
}


@register
class JdbcSource(SourcePlugin):
    """A table, or a query (read in a read-only transaction), split by ranges of an integer
    column. Ranges follow Spark's rule: the bounds set the stride, never filter rows."""

    name = "Jdbc"
    connects = True
    options = (
        *COMMON,
        Option("table", str, default="", help="schema.table (or give query)"),
        Option("table_path", str, default="", help="database.schema.table"),
        Option("query", str, default="", help="a SELECT whose rows are read (instead of table)"),
        Option("where_condition", str, default="", help="a filter on the table's rows"),
        Option(
            "partition_column",
            str,
            default="",
            help="integer column to split by (default: the table's primary key)",
        ),
        Option("split.num", int, default=4, min=1),
        Option("partition_lower_bound", int, help="the lowest value of the ranges' stride"),
        Option("partition_upper_bound", int, help="the highest value of the ranges' stride"),
    )
    aliases = {"partition_num": "split.num"}
    ignored_options = (
        COMMON_IGNORED
        | {
            key: "splits are integer ranges of partition_column"
            for key in (
                "split.size",
                "split.even-distribution.factor.upper-bound",
                "split.even-distribution.factor.lower-bound",
                "split.sample-sharding.threshold",
                "split.inverse-sampling-rate",
                "use_select_count",
                "skip_analyze",
            )
        }
        | {
            "decimal_type_narrowing": "numeric columns are read as decimals",
            "int_type_narrowing": "integer columns keep their type",
            "handle_blob_as_string": "bytea is read as bytes",
            "fetch_size": "each split is read with one binary COPY, in batches of "
            "engine.dataplane.batch-rows rows",
        }
    )

    @classmethod
    def check(cls, config):
        has_table = bool(config["table"] or config["table_path"])
        errors = _table_or_query(config, has_table, SELECT_STATEMENT, "SELECT (or WITH ... SELECT)")
        if errors:
            return errors
        if config["query"] and config["where_condition"]:
            return [("where_condition", "filters a table: put the condition in the query")]
        errors = _check_connection(config, table_required=False)
        if errors:
            return errors
        try:
            with connect_read_only(config) as conn:
                types = dict(cls._columns(conn, config))
                keys = primary_key(conn, config["table"]) if config["table"] else []
        except psycopg.Error as exc:
            reason = (str(exc).strip().splitlines() or ["error"])[0]
            return [("query" if config["query"] else "where_condition", reason)]
        column = config["partition_column"] or next(iter(keys), "")
        if column and types.get(column) not in INTEGER_TYPE_NAMES + INTEGER_TYPES:
            return [("partition_column", f"{column!r} must be an integer column of the rows")]
        if not column and config["table"]:
            return [("partition_column", "the table has no primary key: name a column")]
        unknown = [c for c, t in types.items() if t not in PG_TYPES and t not in PG_TYPE_NAMES]
        if unknown:
            return [
                (
                    "query" if config["query"] else "table",
                    f"unsupported type of: {', '.join(unknown)}",
                )
            ]
        low, high = config["partition_lower_bound"], config["partition_upper_bound"]
        if low is not None and high is not None and low > high:
            return [("partition_lower_bound", "must not be above partition_upper_bound")]
        return []

    @staticmethod
    def _columns(conn, config: dict) -> list[tuple[str, str]]:
        if config["query"] or config.get("where_condition"):
            return query_columns(conn, rows_of(config))
        return table_columns(conn, config["table"])

    def _column(self, conn) -> str:
        if self.config["partition_column"]:
            return self.config["partition_column"]
        keys = primary_key(conn, self.config["table"]) if self.config["table"] else []
        return keys[0] if keys else ""

    @classmethod
    def _typed(cls, conn, config: dict) -> list[tuple[str, str, str]]:
        """(name, PostgreSQL type, Keel kind) of each column read. A ``numeric`` is an exact
        ``decimal(p, s)``: its own precision and scale, or SeaTunnel's ``decimal(38, 18)``
        for a numeric without them (or wider than 38 digits)."""
        columns = cls._columns(conn, config)
        shapes = {}
        if any(t == "numeric" for _, t in columns):
            with conn.cursor() as cur:
                cur.execute(
                    sql.SQL("SELECT * FROM {rows} LIMIT %s").format(rows=rows_of(config)), (0,)
                )
                shapes = {d.name: (d.precision, d.scale) for d in cur.description}
            conn.rollback()
        out = []
        for name, pg_type in columns:
            kind = PG_TYPES.get(pg_type) or PG_TYPE_NAMES[pg_type]
            if pg_type == "numeric":
                precision, scale = shapes.get(name) or (None, None)
                if not precision or precision > 38:
                    precision, scale = 38, 18
                kind = f"decimal({precision}, {scale or 0})"
            out.append((name, pg_type, kind))
        return out

    def output_schema(self) -> Schema:
        with connect_read_only(self.config) as conn:
            typed = self._typed(conn, self.config)
        return Schema(tuple((name, kind) for name, _, kind in typed))

    def create_splits(self, mode: str) -> list[dict]:
        """Contiguous ranges of the partition column, plus one split for its NULLs; a query
        without a partition column is one split."""
        with connect_read_only(self.config) as conn:
            column = self._column(conn)
            if not column:
                return [
                    {"splitId": "all", "column": None, "low": None, "high": None, "total": False}
                ]
            keys = primary_key(conn, self.config["table"]) if self.config["table"] else []
            order = [column, *[k for k in keys if k != column]]
            low, high, nulls = conn.execute(
                sql.SQL(
                    "SELECT min({c}), max({c}), count(*) FILTER (WHERE {c} IS NULL) FROM {t}"
                    " WHERE %s"
                ).format(c=sql.Identifier(column), t=rows_of(self.config)),
                (True,),  # a parameter: the extended protocol, one statement only
            ).fetchone()
        base = {"column": column, "order": order, "total": bool(keys)}
        splits = []
        if low is not None:
            first, last = low, high
            if self.config.get("partition_lower_bound") is not None:
                first = self.config["partition_lower_bound"]
            if self.config.get("partition_upper_bound") is not None:
                last = max(self.config["partition_upper_bound"], first)
            count = self.config["split.num"]
            step = max((last - first + 1) // count, 1)
            start = first
            while start <= last:
                end = last + 1 if len(splits) == count - 1 else min(start + step, last + 1)
                splits.append(
                    {**base, "splitId": f"range-{start}-{end}", "low": start, "high": end}
                )
                start = end
            # The bounds set the stride only: the first and last ranges are open-ended.
            splits[0]["open_low"], splits[-1]["open_high"] = True, True
        if nulls:
            splits.append({**base, "splitId": "nulls", "low": None, "high": None})
        return splits

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Rows of the split in a total order (partition column, then the primary key; a query
        without either: every column), so a resume from ``offset`` rows is exact. Read with
        ADBC (binary COPY of the query) straight into Arrow batches."""
        column = sql.Identifier(split["column"]) if split["column"] else None
        if column is None:
            where = sql.SQL("true")
        elif split["low"] is None:
            where = sql.SQL("{c} IS NULL").format(c=column)
        else:
            # Bounds are integers the engine made, written as literals: ADBC reads a query
            # with COPY, which takes no parameters (and one statement only).
            bounds = []
            if not split.get("open_low"):
                bounds.append(
                    sql.SQL("{c} >= {v}").format(c=column, v=sql.Literal(int(split["low"])))
                )
            if not split.get("open_high"):
                bounds.append(
                    sql.SQL("{c} < {v}").format(c=column, v=sql.Literal(int(split["high"])))
                )
            bounds.append(sql.SQL("{c} IS NOT NULL").format(c=column))
            where = sql.SQL(" AND ").join(bounds)
        order = [
            sql.SQL("keel_query.{c}").format(c=sql.Identifier(c)) for c in split.get("order") or []
        ]
        if not split.get("total", True):  # no primary key in the order: the row breaks ties
            order.append(sql.SQL("keel_query::text"))
        with connect_read_only(self.config) as conn:
            typed = self._typed(conn, self.config)
            query = (
                sql.SQL("SELECT {cols} FROM {t} WHERE {w} ORDER BY {o} OFFSET {n}")
                .format(
                    cols=select_list(typed),
                    t=rows_of(self.config, parameters=False),
                    w=where,
                    o=sql.SQL(", ").join(order),
                    n=sql.Literal(int(offset)),
                )
                .as_string(conn)
            )
        target = arrow_schema(Schema(tuple((name, kind) for name, _, kind in typed)))
        _, max_bytes = limits()
        with pg_arrow.connect(self.config, "keel-jdbc", READ_ONLY) as adbc, adbc.cursor() as cur:
            cur.adbc_statement.set_options(
                **{"adbc.postgresql.batch_size_hint_bytes": str(max_bytes)}
            )
            cur.execute(query)
            for batch in cur.fetch_record_batch():
                for part in bounded(batch, batch_size, max_bytes):
                    offset += part.num_rows
                    yield part.cast(target), offset


#: A source session's transactions are read-only, whatever its query says; dates are read
#: as ISO text, whatever the server's DateStyle.
READ_ONLY = "-c default_transaction_read_only=on -c DateStyle=ISO -c TimeZone=UTC"


def rows_of(config: dict, parameters: bool = True) -> sql.Composable:
    """What a Jdbc source reads, as ``... AS keel_query``: its query, its table's rows that
    match ``where_condition``, or its table. ``parameters``: the statement it goes into also
    takes parameters (then a ``%`` of the job's SQL is written ``%%``)."""
    text = user_sql if parameters else (lambda t: sql.SQL(t.strip().rstrip(";")))
    if config.get("query"):
        return sql.SQL("({q}) AS keel_query").format(q=text(config["query"]))
    if config.get("where_condition"):
        return sql.SQL("(SELECT * FROM {t} WHERE {w}) AS keel_query").format(
            t=table_ident(config["table"]), w=text(config["where_condition"])
        )
    return sql.SQL("{t} AS keel_query").format(t=table_ident(config["table"]))


@register
class JdbcSink(SinkPlugin):
    """Writes a table (``table``, with its schema: ``public.sink``), or runs a custom
    ``query`` (``INSERT ... VALUES (?, ?)``: one ``?`` per incoming field) for every row."""

    name = "Jdbc"
    connects = True
    options = (
        *COMMON,
        Option("table", str, default="", help="schema.table (or give query)"),
        Option("query", str, default="", help="a statement run for each row, ? per field"),
        Option(
            "primary_keys",
            list,
            default=None,
            help="upsert on these columns (idempotent); without them, plain insert",
        ),
        Option("enable_upsert", bool, default=True, help="false: insert even with primary_keys"),
        Option("generate_sink_sql", bool, default=True, help="Keel writes a table's SQL itself"),
        Option("field_ide", str, default="ORIGINAL", choices=tuple(FIELD_IDE)),
        Option(
            "is_exactly_once",
            bool,
            default=False,
            help="checkpointed: two-phase commit with PostgreSQL's prepared transactions "
            "(each row written once; the server's max_prepared_transactions must allow one per "
            "reader and checkpoint in flight); else rows go through a staging table, exactly "
            "once too",
        ),
    )
    ignored_options = COMMON_IGNORED | {
        "batch_size": "each batch a reader hands the sink is written with one COPY",
        "max_retries": "a failed write is retried by recovery from the last checkpoint",
        "support_upsert_by_query_primary_key_exist": "upserts on primary_keys use "
        "INSERT ... ON CONFLICT, which is what it asks for",
        "xa_data_source_class_name": "is_exactly_once prepares PostgreSQL transactions itself",
        "max_commit_attempts": "a commit that fails is retried from the checkpoint",
        "transaction_timeout_sec": "sink sessions end idle transactions after 10 s",
        "auto_commit": "each batch is one transaction",
        "use_copy_statement": "batches are always written with COPY",
        "schema_save_mode": "the table must exist",
        "data_save_mode": "rows are added to the table",
        "custom_sql": "use query",
    }

    @classmethod
    def check(cls, config):
        errors = _table_or_query(
            config, bool(config["table"]), QUERY_STATEMENT, "INSERT, UPDATE, DELETE or MERGE"
        )
        if errors:
            return errors
        if config["query"] and config["primary_keys"]:
            return [("primary_keys", "a custom query does its own upserts: drop primary_keys")]
        errors = _check_connection(config, table_required=False)
        if errors or config["query"]:
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
        if self.config.get("query"):
            wanted = placeholders(self.config["query"])
            if wanted != len(schema.names):
                return [("query", f"has {wanted} ? for {len(schema.names)} incoming fields")]
            return []
        with connect(self.config) as conn:
            columns = {c for c, _ in table_columns(conn, self.config["table"])}
        names = target_columns(self.config, schema)
        missing = [n for n in names if n not in columns]
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
            if self.config.get("is_exactly_once"):
                writer = open_prepared_writer(self.config, schema, context)
                if writer is not None:
                    return writer
            return ExactlyOnceJdbcWriter(self.config, schema, context)
        return JdbcWriter(self.config, schema, context)
