"""Jdbc source and sink: PostgreSQL, MySQL and MariaDB.

What every database shares lives here: the options, the checks of a block's config (a table or
a query, the split options, the save modes) and the plugin classes. The rest (connecting,
columns and types, splits, reads, writers) is its dialect's (engine.connectors.dialects:
engine.connectors.pg_dialect, engine.connectors.mysql.dialect), chosen by the block's URL.
The source splits a table by ranges of a partition column (the primary key by default; an
integer column by stride, another at its quantiles; without either, one split); the sink
upserts on ``primary_keys`` (a replayed batch changes nothing), or writes exactly once
through checkpoints.
"""

from __future__ import annotations

import re

from engine.connectors.base import (
    Option,
    SchemaNotFollowed,
    SinkPlugin,
    SinkWriter,
    SourcePlugin,
)
from engine.connectors.dialects import check_connection, dialect_for
from engine.connectors.jdbc_checks import table_or_query, where_clause
from engine.connectors.jdbc_options import (
    COMMON,
    COMMON_ALIASES,
    COMMON_IGNORED,
    SINK_IGNORED,
    SOURCE_IGNORED,
    SPLIT_OPTIONS,
)
from engine.connectors.jdbc_savemodes import (
    SAVE_MODE_OPTIONS,
    creates_table,
    save_mode_errors,
    save_modes_due,
)
from engine.connectors.jdbc_splits import split_option_errors
from engine.connectors.jdbc_statements import (
    FIELD_IDE,
    QUERY_STATEMENT,
    placeholders,
    target_columns,
)
from engine.connectors.registry import register
from engine.connectors.schema import Schema

#: A source query reads: anything else is refused before it reaches the database (where it
#: would meet a read-only transaction anyway).
SELECT_STATEMENT = re.compile(r"^\s*\(*\s*(select|with|values|table)\b", re.IGNORECASE)


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
        *SPLIT_OPTIONS,
        Option(
            "table_list",
            list,
            default=None,
            help="[{ table_path, query, partition_column, ... }]: a pipeline each",
        ),
        Option("use_regex", bool, default=False, help="table_path as a pattern (not supported)"),
    )
    aliases = {"partition_num": "split.num"} | COMMON_ALIASES
    ignored_options = COMMON_IGNORED | SOURCE_IGNORED
    tables_option = "table_list"

    @classmethod
    def table_entry_problem(cls, entry):
        if not isinstance(entry, dict) or not (entry.get("table_path") or entry.get("query")):
            return "needs table_path or query"
        return None

    @classmethod
    def placeholder_names(cls, config):
        """``database.schema.table``: its table (the url's database when the path names
        none); a query without a table names none."""
        if not config.get("table"):
            return {}
        return dialect_for(config).placeholder_names(config)

    @classmethod
    def notes(cls, config):
        return dialect_for(config).notes(config)

    @classmethod
    def _check_table_list(cls, config) -> list[tuple[str, str]]:
        """A ``table_list`` block: no table or query of its own, every table once."""
        tables = config["table_list"]
        if config["query"] or config["table_path"] or config["table"]:
            return [("table_list", "give either table_list or table_path/query, not both")]
        if not tables:
            return [("table_list", "must name at least one table")]
        paths = [e.get("table_path") for e in tables if isinstance(e, dict) and e.get("table_path")]
        if len(set(paths)) < len(paths):
            return [("table_list", "names a table_path twice")]
        return check_connection(config, table_required=False)

    @classmethod
    def check(cls, config):
        if config["use_regex"]:
            return [("use_regex", "table patterns are not supported: name each in table_list")]
        if config["table_list"] is not None:
            return cls._check_table_list(config)
        has_table = bool(config["table"] or config["table_path"])
        errors = table_or_query(
            config, has_table, SELECT_STATEMENT, "SELECT (or WITH ... SELECT)", both=True
        )
        if errors:
            return errors
        config["where_condition"] = where_clause(config["where_condition"])
        errors = check_connection(config, table_required=False)
        if errors:
            return errors
        errors = split_option_errors(config)
        if errors:
            return errors
        errors = dialect_for(config).source_errors(config)
        if errors:
            return errors
        low, high = config["partition_lower_bound"], config["partition_upper_bound"]
        if low is not None and high is not None and low > high:
            return [("partition_lower_bound", "must not be above partition_upper_bound")]
        return []

    def output_schema(self) -> Schema:
        return dialect_for(self.config).output_schema(self.config)

    def create_splits(self, mode: str) -> list[dict]:
        """Contiguous ranges of the partition column (engine.connectors.jdbc_splits), plus one
        split for its NULLs; a query without a partition column is one split."""
        return dialect_for(self.config).create_splits(self.config)

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Rows of the split in a total order (partition column, then the primary key; a query
        without either: every column), so a resume from ``offset`` rows is exact."""
        yield from dialect_for(self.config).read(self.config, split, offset, batch_size)


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
            help="checkpointed: on PostgreSQL, two-phase commit with prepared transactions "
            "(the server's max_prepared_transactions must allow one per reader and checkpoint "
            "in flight), else a staging table; on MySQL the staging table with a fence row "
            "(not XA); each row written once either way",
        ),
        *SAVE_MODE_OPTIONS,
    )
    aliases = COMMON_ALIASES
    ignored_options = COMMON_IGNORED | SINK_IGNORED

    @classmethod
    def notes(cls, config):
        return dialect_for(config).notes(config)

    @classmethod
    def check(cls, config):
        errors = table_or_query(
            config, bool(config["table"]), QUERY_STATEMENT, "INSERT, UPDATE, DELETE or MERGE"
        )
        if errors:
            return errors
        if config["query"] and config["primary_keys"]:
            return [("primary_keys", "a custom query does its own upserts: drop primary_keys")]
        errors = check_connection(config, table_required=False, missing_ok=True)
        if errors:
            return errors
        keys = config["primary_keys"]
        if keys is not None and (not keys or not all(isinstance(k, str) for k in keys)):
            return [("primary_keys", "must be a non-empty list of column names")]
        dialect = dialect_for(config)
        errors = dialect.sink_errors(config)
        if errors:
            return errors
        columns = dialect.table_columns(config) if config["table"] else set()
        errors = save_mode_errors(config, bool(columns))
        if errors or config["query"] or creates_table(config, bool(columns)):
            return errors  # a created table's keys are checked against the incoming fields
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
        columns = dialect_for(self.config).table_columns(self.config)
        names = target_columns(self.config, schema)
        if creates_table(self.config, bool(columns)):  # made from the incoming fields
            columns, option, where = set(names), "primary_keys", "the incoming fields"
        else:
            option, where = "table", self.config["table"]
        missing = [n for n in names if n not in columns]
        missing += [k for k in self.config.get("primary_keys") or [] if k not in columns]
        if missing:
            return [(option, f"{where} has no column(s) {', '.join(missing)}")]
        return []

    #: The schema it receives, given by engine.member.savemodes before its save modes run.
    input_schema: Schema | None = None

    def save_modes_due(self) -> bool:
        """Whether its save modes may change or check the target before the job's first row."""
        return save_modes_due(self.config)

    def apply_save_modes(self) -> list[str]:
        """Once per job, before its first row (engine.member.savemodes): what was done."""
        return dialect_for(self.config).apply_save_modes(self.config, self.input_schema)

    def writer(self, schema: Schema, context: dict) -> SinkWriter:
        return dialect_for(self.config).writer(self.config, schema, context)

    def follow_schema(self, added: list[tuple[str, str]]) -> None:
        """The table gets the added columns (``ADD COLUMN IF NOT EXISTS``: a restore's second
        time changes nothing), named as ``field_ide`` names the incoming fields."""
        if self.config.get("query"):
            names = ", ".join(name for name, _ in added)
            raise SchemaNotFollowed(
                f"the Jdbc sink's query names its fields: it cannot follow a schema change "
                f"({names} added)"
            )
        dialect_for(self.config).add_columns(self.config, added)
