"""The Jdbc sink's bulk path: Arrow batches into a stage table with ADBC's binary COPY.

Binary COPY takes a column only in its own type, so each stage column is either of a type
Arrow writes directly (``pg_arrow.ingest_type``) or text, which the statement moving the stage
into the target casts back (``target_types``): PostgreSQL parses the text as a text COPY would.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from engine.connectors.arrowrows import arrow_type
from engine.connectors.batches import data
from engine.connectors.jdbc_statements import psycopg_string
from engine.connectors.pg_arrow import ingest_type
from engine.connectors.schema import SCALAR_TYPES, Schema, kind_args

#: Keel kinds the bulk path carries; a stream with another (arrays, maps, nested rows) is
#: written row by row (their PostgreSQL shapes are many).
BULK_KINDS = frozenset(SCALAR_TYPES)


def bulk_capable(schema: Schema) -> bool:
    return all(kind_args(k)[0] in BULK_KINDS for k in schema.kinds)


def column_types(cur, relation: str) -> dict[str, tuple[str, str]]:
    """{column: (type without modifiers, full type)} of a table (``schema.name`` quoted, or a
    temporary table's name), through an ADBC or psycopg cursor."""
    cur.execute(
        "SELECT a.attname::text, format_type(a.atttypid, NULL), format_type(a.atttypid,"
        f" a.atttypmod) FROM pg_attribute a WHERE a.attrelid = {relation}::regclass"
        " AND a.attnum > 0 AND NOT a.attisdropped"
    )
    return {name: (base, full) for name, base, full in cur.fetchall()}


def writes_directly(kind: str, pg_type: str) -> bool:
    """Binary COPY can take a column of this Keel kind into a column of ``pg_type``: the same
    Arrow type, or one Arrow casts exactly (a wider integer, a float, a timestamp's zone).
    Anything else (text into a date, say) is staged as text and parsed by PostgreSQL."""
    target = ingest_type(pg_type)
    if target is None:
        return False
    source = arrow_type(kind)
    if source == target or pa.types.is_null(source):
        return True
    same = (pa.types.is_integer, pa.types.is_floating, pa.types.is_timestamp)
    if any(test(source) and test(target) for test in same):
        return True
    return pa.types.is_integer(source) and pa.types.is_floating(target)


def text_staged(
    columns: list[str], kinds: list[str], stage_types: dict[str, tuple[str, str]]
) -> list[str]:
    """The stage columns that must become text (``ALTER ... TYPE text``) before the bulk path
    uses them: binary COPY cannot write the incoming kind into their type."""
    return [
        c
        for c, kind in zip(columns, kinds, strict=True)
        if stage_types[c][0] != "text" and not writes_directly(kind, stage_types[c][0])
    ]


def plain_table(cur, relation: str) -> bool:
    """An ordinary table without row security or rules: COPY into it is what an INSERT does
    (a view, a table with rules or row security needs the INSERT)."""
    cur.execute(
        "SELECT relkind IN ('r', 'p') AND NOT relrowsecurity AND NOT relhasrules"
        f" FROM pg_class WHERE oid = {relation}::regclass"
    )
    return bool(cur.fetchall()[0][0])


def not_direct(
    cur, relation: str, columns: list[str], kinds: list[str]
) -> tuple[str, dict[str, tuple[str, str]]]:
    """Why batches cannot go straight into ``relation`` with binary COPY ("" when they can),
    and its column types: it must be a plain table, each column taking its field as it is."""
    types = column_types(cur, relation)
    if not plain_table(cur, relation):
        return "the table is not an ordinary table without rules or row security", types
    for column, kind in zip(columns, kinds, strict=True):
        if not writes_directly(kind, types[column][0]):
            return f"field {column} ({kind}) is cast to {types[column][0]} on the way", types
    return "", types


def to_text_ddl(stage: sql.Composable, columns: list[str]) -> sql.Composed:
    return sql.SQL("ALTER TABLE {s} ").format(s=stage) + sql.SQL(", ").join(
        sql.SQL("ALTER COLUMN {c} TYPE text USING {c}::text").format(c=sql.Identifier(c))
        for c in columns
    )


class ArrowStage:
    """Writes batches into one stage table on an ADBC session: each column cast to the stage
    column's Arrow type (text where it has none), plus constant columns (``keel_writer``)."""

    def __init__(
        self,
        adbc,
        schema_name: str | None,  # None: a temporary table
        name: str,
        columns: list[str],
        stage_types: dict[str, tuple[str, str]],
        constants: dict[str, str] | None = None,
        checks: dict[str, str] | None = None,
    ) -> None:
        self.adbc = adbc
        self.cur = adbc.cursor()
        self.schema_name, self.name = schema_name, name
        self.columns = columns
        self.types = [ingest_type(stage_types[c][0]) or pa.string() for c in columns]
        self.constants = constants or {}
        #: {column: type} of text-staged columns to parse as they are written, so a value the
        #: target cannot take fails its batch, never the commit of a completed checkpoint.
        self.checks = checks or {}
        self.checked_upto = -1

    def fit(self, column: pa.Array, target: pa.DataType, name: str) -> pa.Array:
        if column.type == target:
            return column
        try:
            return column.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        try:  # through text, as PostgreSQL would parse it
            return column.cast(pa.string()).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"field {name}: {exc}") from None

    def write(self, batch: pa.RecordBatch, commit: bool = True) -> None:
        values = data(batch)
        arrays = [
            self.fit(column, target, name)
            for column, target, name in zip(values.columns, self.types, self.columns, strict=True)
        ]
        names = list(self.columns)
        for name, value in self.constants.items():
            arrays.append(pc.fill_null(pa.nulls(values.num_rows, pa.string()), value))
            names.append(name)
        table = pa.Table.from_arrays(arrays, names=names)
        if self.schema_name is None:  # the session's temporary table
            self.cur.adbc_ingest(self.name, table, mode="append", temporary=True)
        else:
            self.cur.adbc_ingest(self.name, table, mode="append", db_schema_name=self.schema_name)
        if self.checks:
            self._check()
        if commit:
            self.adbc.commit()

    def _check(self) -> None:
        """Parse the rows just staged (this writer's, above the last checked) as the target's
        types, in the ingest's transaction."""
        where = sql.SQL("keel_mark IS NOT TRUE AND keel_seq > {n}").format(
            n=sql.Literal(self.checked_upto)
        )
        for name, value in self.constants.items():
            where += sql.SQL(" AND {c} = {v}").format(c=sql.Identifier(name), v=sql.Literal(value))
        parsed = sql.SQL(", ").join(
            sql.SQL("count({c}::{t})").format(c=sql.Identifier(c), t=sql.SQL(t))
            for c, t in self.checks.items()
        )
        names = (self.name,) if self.schema_name is None else (self.schema_name, self.name)
        stage = sql.Identifier(*names)
        self.cur.execute(
            psycopg_string(
                sql.SQL("SELECT max(keel_seq), {p} FROM {s} WHERE {w}").format(
                    p=parsed, s=stage, w=where
                )
            )
        )
        newest = self.cur.fetchall()[0][0]
        if newest is not None:
            self.checked_upto = newest

    def close(self) -> None:
        try:
            self.cur.close()
        finally:
            self.adbc.close()
