"""Row schemas: rows travel as tuples in field order; a schema names and types the fields.

A field's type is a string in SeaTunnel's spelling, normalised: the scalars of ``SCALAR_TYPES``,
``decimal(p, s)``, ``array<T>``, ``map<K, V>`` and nested rows, written in a config as an object
of fields and kept as ``row<name: T, ...>``. Values are plain Python: ints, floats, str, bool,
``Decimal`` for a decimal with a precision, ISO strings for timestamps, dates and times, bytes,
lists, dicts, and tuples for nested rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation

SCALAR_TYPES = (
    "tinyint",
    "smallint",
    "int",
    "bigint",
    "float",
    "double",
    "decimal",
    "string",
    "boolean",
    "bytes",
    "date",
    "time",
    "timestamp",
    "null",
)
#: Other spellings SeaTunnel accepts for the same types.
TYPE_ALIASES = {
    "integer": "int",
    "long": "bigint",
    "short": "smallint",
    "byte": "tinyint",
    "bool": "boolean",
    "varchar": "string",
}
#: SeaTunnel's vector types as the types that hold their values (the dimension is the data's,
#: as in SeaTunnel, where a column's type does not carry it): dense vectors are lists of
#: floats, a binary vector its bytes (8 dimensions a byte), a sparse vector index -> value.
VECTOR_TYPES = {
    "float_vector": "array<float>",
    "float16_vector": "array<float>",
    "bfloat16_vector": "array<float>",
    "binary_vector": "bytes",
    "sparse_float_vector": "map<int, float>",
}
#: Kept for the messages that list the types.
FIELD_TYPES = (*SCALAR_TYPES, "decimal(p, s)", "array<T>", "map<K, V>", "{ nested row }")
INTEGERS = ("tinyint", "smallint", "int", "bigint")
#: decimal(38, s) is the widest: Python's default context keeps only 28 digits.
DECIMALS = Context(prec=38)


@dataclass(frozen=True)
class Schema:
    fields: tuple[tuple[str, str], ...]  # (name, type)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.fields]

    @property
    def kinds(self) -> list[str]:
        return [kind for _, kind in self.fields]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def project(self, names: list[str]) -> Schema:
        by_name = dict(self.fields)
        return Schema(tuple((n, by_name[n]) for n in names))

    def to_json(self) -> list[list[str]]:
        return [list(f) for f in self.fields]

    @classmethod
    def from_json(cls, data: list) -> Schema:
        return cls(tuple((str(n), str(t)) for n, t in data))


# -- type strings --------------------------------------------------------------------------------


def split_top(text: str) -> list[str]:
    """``"a, map<b, c>, d"`` -> ``["a", "map<b, c>", "d"]``: commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<({":
            depth += 1
        elif ch in ">)}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


#: How deep types may nest (arrays of maps of rows ...).
MAX_NESTING = 16
_NAME_BREAKERS = set(",:<>()")


def normalise_kind(kind, depth: int = 0) -> str:
    """The canonical spelling of a field type; ValueError names what is wrong."""
    if depth > MAX_NESTING:
        raise ValueError(f"types nest at most {MAX_NESTING} deep")
    if isinstance(kind, dict):
        if not kind:
            raise ValueError("a nested row needs at least one field")
        bad = [name for name in kind if _NAME_BREAKERS & set(str(name)) or not str(name).strip()]
        if bad:
            raise ValueError(f"nested field name {bad[0]!r}: no , : < > ( ) in it")
        inner = ", ".join(f"{name}: {normalise_kind(k, depth + 1)}" for name, k in kind.items())
        return f"row<{inner}>"
    if not isinstance(kind, str):
        raise ValueError(f"unknown type {kind!r}")
    text = kind.strip()
    lowered = text.lower()
    if text.startswith("{"):  # a nested row written as HOCON or JSON: {a = int, b = string}
        return normalise_kind(_row_object(text), depth)
    if lowered in VECTOR_TYPES:
        return VECTOR_TYPES[lowered]
    if m := re.fullmatch(r"decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", lowered):
        precision, scale = int(m[1]), int(m[2])
        if not 1 <= precision <= 38 or scale > precision:
            raise ValueError(f"{text}: precision 1..38 and a scale no larger than it")
        return f"decimal({precision}, {scale})"
    if m := re.fullmatch(r"(array|map|row)\s*<(.*)>", text, flags=re.IGNORECASE | re.DOTALL):
        base, args = m[1].lower(), split_top(m[2])
        if base == "array" and len(args) == 1:
            return f"array<{normalise_kind(args[0], depth + 1)}>"
        if base == "map" and len(args) == 2:
            key, value = normalise_kind(args[0], depth + 1), normalise_kind(args[1], depth + 1)
            return f"map<{key}, {value}>"
        if base == "row":
            fields = {}
            for arg in args:
                name, _, inner = arg.partition(":")
                fields[name.strip()] = inner.strip()
            return normalise_kind(fields, depth)
        raise ValueError(f"{text}: array<T> takes one type, map<K, V> two")
    lowered = TYPE_ALIASES.get(lowered, lowered)
    if lowered in SCALAR_TYPES:
        return lowered
    raise ValueError(f"unknown type {kind!r} (known: {', '.join(FIELD_TYPES)})")


def _row_object(text: str) -> dict:
    """A row type's text (``{c_int = int, c_string = string}``, JSON too) as its fields."""
    from pyhocon import ConfigFactory
    from pyhocon.exceptions import ConfigException
    from pyparsing import ParseBaseException

    from engine.jobconfig import _plain

    if "include" in text or "${" in text:  # a type names fields, it reads nothing
        raise ValueError(f"{text!r}: no include or substitution in a row type")
    try:
        tree = _plain(ConfigFactory.parse_string(f"row = {text}")["row"])
    except (ConfigException, ParseBaseException, ValueError, KeyError):
        raise ValueError(f"{text!r} is not a row type ({{name = type, ...}})") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{text!r} is not a row type ({{name = type, ...}})")
    return tree


def kind_args(kind: str) -> tuple[str, list[str]]:
    """``"map<string, int>"`` -> ``("map", ["string", "int"])``; ``"decimal(10, 2)"`` ->
    ``("decimal", ["10", "2"])``; a nested row's args are ``"name: type"`` strings."""
    if m := re.fullmatch(r"(\w+)[<(](.*)[>)]", kind, flags=re.DOTALL):
        return m[1], split_top(m[2])
    return kind, []


def row_fields(kind: str) -> list[tuple[str, str]]:
    _, args = kind_args(kind)
    return [(a.partition(":")[0].strip(), a.partition(":")[2].strip()) for a in args]


#: What a ``schema.columns`` entry may say (SeaTunnel's column options).
COLUMN_KEYS = ("name", "type", "nullable", "defaultValue", "comment", "columnLength", "columnScale")


def column_fields(columns) -> tuple[dict, list[tuple[str, str]]]:
    """SeaTunnel's ``schema.columns`` (``[{ name = id, type = bigint, ... }]``) as the
    ``fields`` object it says the same as: {name: type}, [(option, message)]."""
    if not isinstance(columns, list) or not columns:
        return {}, [("schema.columns", "must be a list of { name = ..., type = ... }")]
    fields, errors = {}, []
    for n, column in enumerate(columns):
        path = f"schema.columns[{n}]"
        if not isinstance(column, dict) or not column.get("name") or not column.get("type"):
            errors.append((path, "needs a name and a type"))
            continue
        unknown = sorted(set(column) - set(COLUMN_KEYS))
        if unknown:
            errors.append((f"{path}.{unknown[0]}", f"unknown (known: {', '.join(COLUMN_KEYS)})"))
        elif str(column["name"]) in fields:
            errors.append((f"{path}.name", f"{column['name']!r} is named twice"))
        fields[str(column["name"])] = column["type"]
    return fields, errors


def parse_schema(tree: dict | None) -> tuple[Schema | None, list[tuple[str, str]]]:
    """``schema { fields { id = bigint, name = string } }`` -> Schema, [(option, message)]."""
    if not tree:
        return None, []
    fields = tree.get("fields")
    if fields is None and tree.get("columns") is not None:
        fields, errors = column_fields(tree["columns"])
        if errors:
            return None, errors
    if not isinstance(fields, dict) or not fields:
        message = "must be an object of field = type (or schema.columns, [{ name, type }])"
        return None, [("schema.fields", message)]
    errors = []
    out = []
    for name, kind in fields.items():
        try:
            out.append((name, normalise_kind(kind)))
        except ValueError as exc:
            errors.append((f"schema.fields.{name}", str(exc)))
    return (Schema(tuple(out)) if not errors else None), errors


# -- values --------------------------------------------------------------------------------------


def convert(kind: str, value, null_format: str | None = None):
    """A value read from a file (text, or already typed by JSON, Parquet or Excel) as the
    field's type. ValueError says why it does not fit."""
    if value is None or value == "" or (null_format is not None and value == null_format):
        return None
    base, args = kind_args(kind)
    if base in INTEGERS:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return int(value)
    if base in ("double", "float"):
        return float(value)
    if base == "decimal":
        if not args:
            return float(value)
        try:
            unit = Decimal(1).scaleb(-int(args[1]))
            return Decimal(str(value)).quantize(unit, context=DECIMALS)
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a decimal") from None
    if base == "boolean":
        if isinstance(value, bool):
            return value
        return str(value).strip().lower() in ("true", "1", "t", "yes")
    if base == "bytes":
        return value if isinstance(value, bytes) else str(value).encode()
    if base in ("timestamp", "date", "time"):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    if base in ("array", "map", "row"):
        if isinstance(value, str):
            value = json.loads(value)
        if base == "array":
            return [convert(args[0], v, null_format) for v in value]
        if base == "map":
            return {convert(args[0], k): convert(args[1], v) for k, v in dict(value).items()}
        fields = row_fields(kind)
        if isinstance(value, dict):
            return tuple(convert(k, value.get(n), null_format) for n, k in fields)
        return tuple(convert(k, v, null_format) for (_, k), v in zip(fields, value, strict=True))
    if base == "null":
        return None
    return value if isinstance(value, str) else str(value)


def jsonable(kind: str, value):
    """A value as JSON can hold it: a nested row as an object, bytes as text, a decimal as a
    string (exact)."""
    if value is None:
        return None
    base, args = kind_args(kind)
    if base == "row":
        return {n: jsonable(k, v) for (n, k), v in zip(row_fields(kind), value, strict=True)}
    if base == "array":
        return [jsonable(args[0], v) for v in value]
    if base == "map":
        return {str(k): jsonable(args[1], v) for k, v in value.items()}
    if base == "bytes":
        return value.decode(errors="replace")
    if isinstance(value, Decimal):
        return str(value)
    return value


# -- row kinds -----------------------------------------------------------------------------------


class KindRow(tuple):
    """A row whose changelog kind is not INSERT (a FakeSource ``rows`` entry); plain tuples
    are INSERT. A transform that builds new rows makes them INSERT."""

    kind: str


def with_kind(values: tuple, kind: str) -> tuple:
    if kind == "INSERT":
        return values
    row = KindRow(values)
    row.kind = kind
    return row


def row_kind(row: tuple) -> str:
    return getattr(row, "kind", "INSERT")
