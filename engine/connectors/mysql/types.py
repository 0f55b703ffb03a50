"""MySQL column types as Keel's and back (SeaTunnel's MySqlTypeConverter's mapping), the
server's text of a column as an Arrow array, and an Arrow batch as LOAD DATA's text."""

from __future__ import annotations

import json
import re
from datetime import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.arrowrows import arrow_type
from engine.connectors.schema import DECIMALS, Schema, jsonable, kind_args

#: A decimal wider than Keel's 38 digits is read as SeaTunnel's default, decimal(38, 18).
WIDEST, DEFAULT_DECIMAL = 38, "decimal(38, 18)"
_STRINGS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json", "enum", "set")
_BYTES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "vector")
#: The geometry types' own names (their values are bytes, as a geometry's).
_GEOMETRIES = (
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
    "geomcollection",
)
_INTS = {
    ("tinyint", False): "tinyint",
    ("tinyint", True): "smallint",
    ("smallint", False): "smallint",
    ("smallint", True): "int",
    ("mediumint", False): "int",
    ("mediumint", True): "int",
    ("int", False): "int",
    ("integer", False): "int",
    ("int", True): "bigint",
    ("integer", True): "bigint",
    ("year", False): "int",
    ("bigint", False): "bigint",
    ("bigint", True): "decimal(20, 0)",
}
INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")
_COLUMN = re.compile(r"^\s*(\w+)\s*(?:\(([^)]*)\))?\s*(.*)$")


def parse_column_type(column_type: str) -> tuple[str, list[str], bool]:
    """``"decimal(10,2) unsigned zerofill"`` -> ``("decimal", ["10", "2"], True)``."""
    match = _COLUMN.match(column_type.lower())
    if not match:
        raise ValueError(f"unknown MySQL type {column_type!r}")
    args = [a.strip() for a in (match[2] or "").split(",") if a.strip()]
    return match[1], args, "unsigned" in match[3]


def keel_kind(column_type: str, tiny_int1_is_bit: bool = True) -> str:
    """The Keel type of a MySQL column type (``information_schema.COLUMNS.COLUMN_TYPE``); a
    type without a mapping (MariaDB's uuid and inet6, a vector) is read as its text."""
    base, args, unsigned = parse_column_type(column_type)
    if base == "bit":
        return "boolean" if not args or args[0] == "1" else "bytes"
    if base == "tinyint" and args == ["1"] and tiny_int1_is_bit and not unsigned:
        return "boolean"
    if base in ("bool", "boolean"):
        return "boolean"
    if (base, unsigned) in _INTS or (base, False) in _INTS:
        return _INTS.get((base, unsigned)) or _INTS[(base, False)]
    if base == "float":
        return "float"
    if base in ("double", "real"):
        return "double"
    if base in ("decimal", "numeric", "dec", "fixed"):
        precision = int(args[0]) if args else 10
        scale = int(args[1]) if len(args) > 1 else 0
        precision += 1 if unsigned else 0
        return DEFAULT_DECIMAL if precision > WIDEST else f"decimal({precision}, {scale})"
    if base in _STRINGS:
        return "string"
    if base in _BYTES or base in _GEOMETRIES:
        return "bytes"
    if base == "date":
        return "date"
    if base == "time":
        return "time"
    if base in ("datetime", "timestamp"):
        return "timestamp"
    if base == "null":
        return "null"
    return "string"


#: PyMySQL's field type codes as MySQL type names (a query's columns, from its metadata).
_FIELD_TYPES = {
    0: "decimal",
    246: "decimal",
    1: "tinyint",
    2: "smallint",
    3: "int",
    9: "mediumint",
    8: "bigint",
    4: "float",
    5: "double",
    6: "null",
    7: "timestamp",
    12: "datetime",
    10: "date",
    14: "date",
    11: "time",
    13: "year",
    16: "bit",
    245: "json",
    247: "enum",
    248: "set",
    255: "geometry",
}
_UNSIGNED, _ENUM, _SET, BINARY_CHARSET = 32, 256, 2048, 63


def field_column_type(field) -> str:
    """A result column's type (PyMySQL's ``Field``) written as a COLUMN_TYPE."""
    code, charset = field.type_code, field.charsetnr
    unsigned = " unsigned" if field.flags & _UNSIGNED else ""
    if code in (0, 246):
        precision = field.length - (1 if field.scale else 0) - (0 if unsigned else 1)
        return f"decimal({max(precision, 1)},{field.scale}){unsigned}"
    if field.flags & _ENUM or field.flags & _SET:
        return "enum" if field.flags & _ENUM else "set"
    if code in _FIELD_TYPES:
        name = _FIELD_TYPES[code]
        width = f"({field.length})" if name in ("tinyint", "bit") else ""
        return f"{name}{width}{unsigned}"
    if code in (249, 250, 251, 252):
        return "blob" if charset == BINARY_CHARSET else "text"
    return "varbinary" if charset == BINARY_CHARSET else "varchar"


# -- reading: the server's text as Arrow ---------------------------------------------------------


def _raw(values: list) -> pa.Array:
    first = next((v for v in values if v is not None), None)
    return pa.array(values, pa.binary() if isinstance(first, bytes) else pa.string())


def _strings(values: list) -> pa.Array:
    array = _raw(values)
    return array.cast(pa.string()) if pa.types.is_binary(array.type) else array


def _no_zero_dates(array: pa.Array) -> pa.Array:
    """MySQL's zero dates (``0000-00-00``, a zero month or day) as NULL, as Connector/J's
    ``zeroDateTimeBehavior=convertToNull`` reads them."""
    zero = pc.match_substring_regex(array, r"^0000-|^\d{4}-00-|^\d{4}-\d{2}-00")
    return pc.if_else(pc.fill_null(zero, False), pa.scalar(None, pa.string()), array)


def _time(value: str | None) -> time | None:
    if value is None:
        return None
    try:
        return time.fromisoformat(value)
    except ValueError:
        raise ValueError(f"time {value!r} is outside a day, which Keel's time holds") from None


def column_array(values: list, kind: str, column_type: str) -> pa.Array:
    """The values a text-protocol session read (str or bytes, None for NULL) as the Arrow
    array of ``kind``; ValueError says which value does not fit."""
    target = arrow_type(kind)
    base, args = kind_args(kind)
    mysql_base = parse_column_type(column_type)[0]
    if base == "bytes" or base == "null":
        return pa.array(values, target)
    if base == "boolean" and mysql_base == "bit":
        return pc.not_equal(_raw(values).cast(pa.binary()), pa.scalar(b"\x00"))
    strings = _strings(values)
    if base == "boolean":
        return pc.not_equal(strings.cast(pa.int64()), 0)
    if base == "time":
        return pa.array([_time(v) for v in strings.to_pylist()], target)
    if base in ("date", "timestamp"):
        return _no_zero_dates(strings).cast(target)
    if base == "decimal" and args and mysql_base not in INTEGER_TYPES:
        _, source_args, _ = parse_column_type(column_type)
        scale = int(source_args[1]) if len(source_args) > 1 else 0
        if scale != int(args[1]):  # narrowed to decimal(38, 18): rounded as SeaTunnel's cast
            unit = Decimal(1).scaleb(-int(args[1]))
            return pa.array(
                [
                    None if v is None else Decimal(v).quantize(unit, context=DECIMALS)
                    for v in strings.to_pylist()
                ],
                target,
            )
    return strings.cast(target)


def batch_of(rows: list[tuple], columns: list[tuple[str, str, str]]) -> pa.RecordBatch:
    """Rows read as text, as a batch of ``columns`` ((name, MySQL type, Keel kind))."""
    values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    arrays = []
    for (name, column_type, kind), column in zip(columns, values, strict=True):
        try:
            arrays.append(column_array(list(column), kind, column_type))
        except (ValueError, pa.ArrowException) as exc:
            raise ValueError(f"column {name} ({column_type}): {exc}") from None
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _, _ in columns])


# -- writing: a batch as LOAD DATA's text --------------------------------------------------------

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\0", "\\0"))


def _escaped(array: pa.Array) -> pa.Array:
    for plain, escaped in _ESCAPES:
        array = pc.replace_substring(array, plain, escaped)
    return array


def _text(array: pa.Array, kind: str) -> pa.Array:
    """A column as LOAD DATA's text of it (binary), NULL as ``\\N``."""
    base, _ = kind_args(kind)
    if base == "boolean":
        array = array.cast(pa.int8()).cast(pa.string())
    elif base in ("array", "map", "row"):
        array = pa.array(
            [None if v is None else json.dumps(jsonable(kind, v)) for v in _keel_values(array)],
            pa.string(),
        )
        array = _escaped(array)
    elif base == "bytes":
        array = _escaped(array.cast(pa.binary()))
    elif base == "string":
        array = _escaped(array)
    elif base == "null":
        array = pa.nulls(len(array), pa.string())
    else:
        array = array.cast(pa.string())
    return pc.fill_null(array.cast(pa.binary()), pa.scalar(b"\\N"))


def _keel_values(array: pa.Array) -> list:
    from engine.connectors.arrowrows import rows_of, schema_of

    schema = schema_of(pa.schema([("v", array.type)]))
    return [row[0] for row in rows_of(pa.table({"v": array}), schema)]


def load_payload(batch: pa.RecordBatch, schema: Schema) -> bytes:
    """A batch (without its row kind column) in LOAD DATA's default format: tab-separated,
    one row a line, backslash escapes, ``\\N`` for NULL; built by Arrow's kernels."""
    if batch.num_rows == 0:
        return b""
    columns = [_text(batch.column(i), kind) for i, kind in enumerate(schema.kinds)]
    if len(columns) == 1:
        lines = columns[0]
    else:
        lines = pc.binary_join_element_wise(*columns, pa.scalar(b"\t"))
    return b"\n".join(lines.to_pylist()) + b"\n"


# -- Keel types as MySQL's (CREATE TABLE) --------------------------------------------------------

_DDL = {
    "tinyint": "TINYINT",
    "smallint": "SMALLINT",
    "int": "INT",
    "bigint": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "TINYINT(1)",
    "string": "LONGTEXT",
    "bytes": "LONGBLOB",
    "date": "DATE",
    "time": "TIME(6)",
    "timestamp": "DATETIME(6)",
    "null": "TEXT",
}
#: A key column must have a length: strings and bytes that are keys get one.
_KEY_DDL = {"string": "VARCHAR(255)", "bytes": "VARBINARY(255)"}


def mysql_type(kind: str, key: bool = False) -> str:
    """The MySQL column type that holds a Keel type (SeaTunnel's reconvert, with times and
    timestamps to the microsecond and arrays, maps and rows as JSON)."""
    base, args = kind_args(kind)
    if key and base in _KEY_DDL:
        return _KEY_DDL[base]
    if base == "decimal":
        precision, scale = (args[0], args[1]) if args else ("38", "18")
        return f"DECIMAL({precision},{scale})"
    if base in ("array", "map", "row"):
        return "JSON"
    return _DDL[base]


def create_table_sql(table: str, schema: Schema, keys: list[str] | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for a stream's fields (``table`` quoted), keyed on
    ``keys`` when given."""
    from engine.connectors.mysql.sessions import quote

    keys = keys or []
    columns = [
        f"{quote(name)} {mysql_type(kind, name in keys)}{' NOT NULL' if name in keys else ''}"
        for name, kind in schema.fields
    ]
    if keys:
        columns.append(f"PRIMARY KEY ({', '.join(quote(k) for k in keys)})")
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}) DEFAULT CHARSET=utf8mb4"
