"""The Sql transform: SeaTunnel's ``query`` (a select list with expressions and functions, and a
WHERE) over each batch, run by DuckDB on the batch as an Arrow table.

The batch is the table ``dual`` (SeaTunnel's name) and also the transform's input stream name,
so ``select ... from fake`` works as in older SeaTunnel configs. The output schema is what DuckDB
answers for the query over an empty table of the input schema, found when the job is planned; a
query DuckDB rejects is a 400 that quotes DuckDB's message. Functions are DuckDB's (most of
SeaTunnel's have the same name there: ``upper``, ``concat``, ``regexp_replace``, ``abs``...).
"""

from __future__ import annotations

import json
import re
import threading

from engine.connectors.base import Option, TransformPlugin
from engine.connectors.registry import register
from engine.connectors.schema import Schema

#: Statements other than a query are refused before DuckDB sees them.
_QUERY = re.compile(r"^\s*(select|with)\b", re.IGNORECASE)
#: DuckDB settings for a transform: no files, no extensions, bounded memory, one thread (the
#: reader's: the data plane's parallelism is its readers).
_SETTINGS = {
    "threads": 1,
    "memory_limit": "256MB",
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}


def connect():
    import duckdb

    return duckdb.connect(":memory:", config=dict(_SETTINGS))


@register
class Sql(TransformPlugin):
    name = "Sql"
    options = (Option("query", str, required=True, help="select ... from dual [where ...]"),)

    @classmethod
    def check(cls, config):
        if not _QUERY.match(config["query"]):
            return [("query", "must be a SELECT (or WITH ... SELECT) query")]
        if ";" in config["query"].strip().rstrip(";"):
            return [("query", "must be one statement")]
        return []

    def table_names(self) -> list[str]:
        names = ["dual"]
        stream = self.config.get("plugin_input")  # the one stream it reads, once wired
        if (
            isinstance(stream, str)
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", stream)
            and stream != "dual"
        ):
            names.append(stream)
        return names

    def run(self, con, table, limit: int | None = None):
        for name in self.table_names():
            con.register(name, table)
        try:
            relation = con.sql(self.config["query"].strip().rstrip(";"))
            if limit is not None:
                names = relation.columns
                duplicated = sorted({n for n in names if names.count(n) > 1})
                if duplicated:
                    raise ValueError(
                        f"query: the result names {', '.join(duplicated)} more than once"
                    )
                relation = relation.limit(limit)
            return relation.to_arrow_table()
        finally:
            for name in self.table_names():
                con.unregister(name)

    def output_schema(self, schema: Schema) -> Schema:
        import duckdb

        from engine.connectors.arrowrows import arrow_schema, schema_of

        con = connect()
        try:
            # LIMIT 0: the answer's types, without running the query's work at plan time.
            result = self.run(con, arrow_schema(schema).empty_table(), limit=0)
        except duckdb.Error as exc:
            message = str(exc).splitlines()[0]
            raise ValueError(f"query: {message}") from None
        finally:
            con.close()
        try:
            return schema_of(result.schema)
        except ValueError as exc:
            raise ValueError(f"query: {exc}") from None

    def projection(self, schema: Schema, out) -> list[int] | None:
        """The input column behind each output column when the query only selects columns
        (``select a, b as c from dual``, ``select *``) and each keeps its type: the batch's
        own columns are then the answer, with no query planned per batch (DuckDB's planning
        of each batch costs more than its rows). None for any other query."""
        from engine.connectors.arrowrows import arrow_schema

        con = connect()
        try:
            tree = json.loads(
                con.execute("SELECT json_serialize_sql(?)", [self.config["query"]]).fetchall()[0][0]
            )
        finally:
            con.close()
        statements = tree.get("statements") or []
        if tree.get("error") or len(statements) != 1:
            return None
        columns = _selected_columns(statements[0]["node"], schema.names, self.table_names())
        if columns is None or len(columns) != len(out):
            return None
        given = arrow_schema(schema)
        if any(given.field(i).type != out.field(k).type for k, i in enumerate(columns)):
            return None
        return columns

    def processor(self, schema: Schema):
        """DuckDB reads the batch where it lies (Arrow, no copy) and answers in Arrow; the
        answer is cast to the planned output types. Rows it makes are INSERTs."""
        import pyarrow as pa

        from engine.connectors.arrowrows import arrow_schema
        from engine.connectors.batches import data

        out = arrow_schema(self.output_schema(schema))
        nothing = pa.RecordBatch.from_pylist([], schema=out)
        columns = self.projection(schema, out)
        if columns is not None:

            def select(batch):
                return pa.RecordBatch.from_arrays([batch.column(i) for i in columns], schema=out)

            return select
        local = threading.local()  # a DuckDB connection is used by one thread at a time

        def process(batch):
            if batch.num_rows == 0:
                return nothing
            con = getattr(local, "con", None)
            if con is None:
                con = local.con = connect()
            table = self.run(con, pa.Table.from_batches([data(batch)]))
            table = table.rename_columns(out.names).cast(out)
            return table.combine_chunks().to_batches()[0] if table.num_rows else nothing

        return process


#: Parts of a SELECT that make it more than a choice of columns (DuckDB's parse tree).
_CLAUSES = ("where_clause", "having", "sample", "qualify", "group_expressions", "group_sets")


def _selected_columns(node: dict, names: list[str], tables: list[str]) -> list[int] | None:
    """For ``SELECT col [AS alias], ... | * FROM <table>`` and nothing more, the index of the
    input column each output column is (resolved as DuckDB does: exact, else the one name
    equal ignoring case); else None."""
    source = node.get("from_table") or {}
    if (
        node.get("type") != "SELECT_NODE"
        or node.get("modifiers")
        or (node.get("cte_map") or {}).get("map")
        or any(node.get(clause) for clause in _CLAUSES)
        or node.get("aggregate_handling", "STANDARD_HANDLING") != "STANDARD_HANDLING"
        or source.get("type") != "BASE_TABLE"
        or source.get("schema_name")
        or source.get("catalog_name")
        or source.get("sample")
        or source.get("at_clause")
        or source.get("column_name_alias")
        or source.get("table_name", "").lower() not in {t.lower() for t in tables}
    ):
        return None
    qualifiers = {source["table_name"].lower(), (source.get("alias") or "").lower()} - {""}
    columns: list[int] = []
    for item in node.get("select_list") or []:
        if item.get("class") == "STAR" and not any(
            item.get(key)
            for key in (
                "exclude_list",
                "replace_list",
                "rename_list",
                "qualified_exclude_list",
                "columns",
                "expr",
            )
        ):
            if item.get("relation_name") and item["relation_name"].lower() not in qualifiers:
                return None
            columns += range(len(names))
            continue
        path = item.get("column_names") or []
        if item.get("class") != "COLUMN_REF" or not 1 <= len(path) <= 2:
            return None
        if len(path) == 2 and path[0].lower() not in qualifiers:
            return None
        index = _resolve(path[-1], names)
        if index is None:
            return None
        columns.append(index)
    return columns or None


def _resolve(name: str, names: list[str]) -> int | None:
    if name in names:
        return names.index(name)
    matches = [i for i, n in enumerate(names) if n.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None
