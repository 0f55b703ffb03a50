"""Rows as Arrow tables and back: the types of a Keel schema as Arrow's, for Parquet and ORC
files and for the Sql transform's DuckDB."""

from __future__ import annotations

from datetime import date, datetime, time
from decimal import Decimal

import pyarrow as pa

from engine.connectors.schema import Schema, kind_args, row_fields


def arrow_type(kind: str):
    base, args = kind_args(kind)
    scalars = {
        "tinyint": pa.int8(),
        "smallint": pa.int16(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "boolean": pa.bool_(),
        "bytes": pa.binary(),
        "date": pa.date32(),
        "time": pa.time64("us"),
        "timestamp": pa.timestamp("us"),
        "null": pa.null(),
    }
    if base == "decimal":
        return pa.decimal128(int(args[0]), int(args[1])) if args else pa.float64()
    if base == "array":
        return pa.list_(arrow_type(args[0]))
    if base == "map":
        return pa.map_(arrow_type(args[0]), arrow_type(args[1]))
    if base == "row":
        return pa.struct([(n, arrow_type(k)) for n, k in row_fields(kind)])
    return scalars[base]


def keel_kind(t) -> str:
    if pa.types.is_decimal(t):
        return f"decimal({t.precision}, {t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{keel_kind(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{keel_kind(t.key_type)}, {keel_kind(t.item_type)}>"
    if pa.types.is_struct(t):
        return "row<" + ", ".join(f"{f.name}: {keel_kind(f.type)}" for f in t) + ">"
    if pa.types.is_signed_integer(t):
        return {8: "tinyint", 16: "smallint", 32: "int"}.get(t.bit_width, "bigint")
    if pa.types.is_floating(t):
        return "float" if t.bit_width == 32 else "double"
    named = {"bool": "boolean", "binary": "bytes", "large_binary": "bytes", "null": "null"}
    for name, test in (("timestamp", pa.types.is_timestamp), ("date", pa.types.is_date)):
        if test(t):
            return name
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_integer(t) and t.bit_width < 64:  # unsigned, and narrow enough for bigint
        return "bigint"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view":
        return "string"
    if str(t) in named:
        return named[str(t)]
    raise ValueError(f"has type {t}, which Keel does not carry (cast it)")


def _arrow_value(kind: str, value):
    """A row value as pyarrow takes it for ``arrow_type(kind)``."""
    if value is None:
        return None
    base, args = kind_args(kind)
    if base == "timestamp":
        return datetime.fromisoformat(value) if isinstance(value, str) else value
    if base == "date":
        return date.fromisoformat(value) if isinstance(value, str) else value
    if base == "time":
        return time.fromisoformat(value) if isinstance(value, str) else value
    if base == "decimal":  # without a precision, a decimal is a double (PostgreSQL's numeric)
        if not args:
            return float(value)
        return value if isinstance(value, Decimal) else Decimal(str(value))
    if base == "array":
        return [_arrow_value(args[0], v) for v in value]
    if base == "map":
        return [(k, _arrow_value(args[1], v)) for k, v in value.items()]
    if base == "row":
        return {n: _arrow_value(k, v) for (n, k), v in zip(row_fields(kind), value, strict=True)}
    return value


#: Types whose Python values Arrow takes and gives back as they are.
_AS_IS = frozenset(
    ("tinyint", "smallint", "int", "bigint", "float", "double", "string", "boolean", "bytes")
)


def arrow_schema(schema: Schema) -> pa.Schema:
    return pa.schema([(n, arrow_type(k)) for n, k in schema.fields])


def to_table(rows: list[tuple], schema: Schema, arrow: pa.Schema | None = None) -> pa.Table:
    arrow = arrow or arrow_schema(schema)
    values = list(zip(*rows, strict=True)) if rows else [() for _ in schema.fields]
    columns = []
    for i, kind in enumerate(schema.kinds):
        column = values[i]
        if kind_args(kind)[0] not in _AS_IS:
            column = [_arrow_value(kind, v) for v in column]
        columns.append(pa.array(column, type=arrow.field(i).type))
    return pa.Table.from_arrays(columns, schema=arrow)


def schema_of(arrow: pa.Schema) -> Schema:
    """Keel's schema for an Arrow one; ValueError names a column whose type has none."""
    fields = []
    for f in arrow:
        try:
            fields.append((f.name, keel_kind(f.type)))
        except ValueError as exc:
            raise ValueError(f"column {f.name} {exc}") from None
    return Schema(tuple(fields))


def rows_of(table: pa.Table, schema: Schema) -> list[tuple]:
    """The table's rows as Keel values (ISO strings for times, dicts for maps, tuples for
    nested rows)."""
    columns = []
    for kind, column in zip(schema.kinds, table.columns, strict=True):
        values = column.to_pylist()
        if kind_args(kind)[0] not in _AS_IS:
            convert = _python_value(kind)
            values = [convert(v) for v in values]
        columns.append(values)
    return list(zip(*columns, strict=True)) if columns else []


def _python_value(kind: str):
    base, args = kind_args(kind)
    if base in ("timestamp", "date", "time"):
        return lambda v: None if v is None else v.isoformat()
    if base == "map":
        inner = _python_value(args[1])
        return lambda v: None if v is None else {k: inner(x) for k, x in v}
    if base == "array":
        inner = _python_value(args[0])
        return lambda v: None if v is None else [inner(x) for x in v]
    if base == "row":
        fields = [(n, _python_value(k)) for n, k in row_fields(kind)]
        return lambda v: None if v is None else tuple(f(v[n]) for n, f in fields)
    return lambda v: v
