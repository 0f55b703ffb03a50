"""The Sql transform: SeaTunnel's ``query`` (a select list with expressions and functions, and a
WHERE) over each batch, run by DuckDB on the batch as an Arrow table.

The batch is the table ``dual`` (SeaTunnel's name) and also the transform's input stream name,
so ``select ... from fake`` works as in older SeaTunnel configs. The output schema is what DuckDB
answers for the query over an empty table of the input schema, found when the job is planned; a
query DuckDB rejects is a 400 that quotes DuckDB's message. Functions are DuckDB's (most of
SeaTunnel's have the same name there: ``upper``, ``concat``, ``regexp_replace``, ``abs``...).
"""

from __future__ import annotations

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
        stream = self.config.get("plugin_input")
        if stream and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", stream) and stream != "dual":
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

    def processor(self, schema: Schema):
        """DuckDB reads the batch where it lies (Arrow, no copy) and answers in Arrow; the
        answer is cast to the planned output types. Rows it makes are INSERTs."""
        import pyarrow as pa

        from engine.connectors.arrowrows import arrow_schema
        from engine.connectors.batches import data

        out = arrow_schema(self.output_schema(schema))
        nothing = pa.RecordBatch.from_pylist([], schema=out)
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
