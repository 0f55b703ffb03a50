"""FakeSource: deterministic rows from a declared schema, split by split, replayable by offset.

Row ``i`` of split ``s`` has the global id ``s * row.num + i`` in BATCH mode, so a job's rows are
known in advance (tests compare exact row sets). In STREAMING mode a split never ends: ids are
``s + i * split.num`` (unique across splits), paced at ``rows.per-second`` per split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal

from engine.connectors.base import Option, SourcePlugin
from engine.connectors.batches import ROW_SOURCE_BATCH
from engine.connectors.registry import register
from engine.connectors.schema import (
    Schema,
    convert,
    kind_args,
    parse_schema,
    row_fields,
    with_kind,
)
from engine.sourceruntime.capability import ManagedSourceCapability
from engine.states import JobMode

#: SeaTunnel's row kinds (a changelog's). Keel's sinks write every row as data; the kind is
#: kept on the row for FilterRowKind.
ROW_KINDS = ("INSERT", "UPDATE_BEFORE", "UPDATE_AFTER", "DELETE")
DEFAULT_SCHEMA = Schema((("id", "bigint"), ("name", "string"), ("value", "double")))
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


_EXPRESSIONS = {
    "int": "i",
    "bigint": "i",
    "string": "f'{{p{n}}}{{i}}'",
    "double": "i * 0.5",
    "float": "i * 0.5",
    "decimal": "i * 0.5",
    "boolean": "i % 2 == 0",
    "timestamp": "(EPOCH + timedelta(seconds=i)).isoformat()",
}


def _fit(length: int):
    """Strings of exactly ``length`` characters that keep the row id: padded with ``x``, or
    their last ``length`` characters."""

    def fit(value: str) -> str:
        return value.ljust(length, "x") if len(value) <= length else value[-length:]

    return fit


@dataclass(frozen=True)
class Sizes:
    """The data-shape options: lengths of strings and bytes, sizes of arrays and maps."""

    string: int | None = None
    bytes: int = 5
    array: int = 5
    map: int = 5


def value_of(kind: str, name: str, sizes: Sizes):
    """A function from a row id to the field's value: deterministic, so a replay from an
    offset is exact and tests know every value in advance."""
    base, args = kind_args(kind)
    if base in _EXPRESSIONS and not (base == "decimal" and args):
        if base == "string" and sizes.string:
            fit = _fit(sizes.string)
            return lambda i: fit(f"{name}-{i}")
        return eval(  # noqa: S307 - a fixed template; the field name is passed as a value
            f"lambda i: {_EXPRESSIONS[base].format(n=0)}",
            {"EPOCH": EPOCH, "timedelta": timedelta, "p0": f"{name}-"},
        )
    if base == "tinyint":
        return lambda i: i % 128
    if base == "smallint":
        return lambda i: i % 32768
    if base == "decimal":
        precision, scale = int(args[0]), int(args[1])
        unit, bound = Decimal(1).scaleb(-scale), 10 ** (precision - scale)
        return lambda i: (Decimal(i % bound) / 2).quantize(unit, rounding=ROUND_DOWN)
    if base == "bytes":
        fit = _fit(sizes.bytes)
        return lambda i: fit(f"{name}-{i}").encode()
    if base == "date":
        return lambda i: (EPOCH.date() + timedelta(days=i)).isoformat()
    if base == "time":
        return lambda i: (EPOCH + timedelta(seconds=i)).time().isoformat()
    if base == "null":
        return lambda i: None
    if base == "array":
        item = value_of(args[0], name, sizes)
        return lambda i: [item(i + k) for k in range(sizes.array)]
    if base == "map":
        key, item = value_of(args[0], name, sizes), value_of(args[1], name, sizes)
        return lambda i: {key(i + k): item(i + k) for k in range(sizes.map)}
    fields = [value_of(k, f"{name}.{n}", sizes) for n, k in row_fields(kind)]
    return lambda i: tuple(f(i) for f in fields)


def row_builder(schema: Schema, sizes: Sizes | None = None):
    """A function from a range of row ids to rows, compiled for the schema.

    The comprehension is generated from fixed templates (user-given field names are passed in as
    values, never as code), so generation costs what a hand-written loop costs; other types
    call their value function.
    """
    sizes = sizes or Sizes()
    parts, values = [], {"EPOCH": EPOCH, "timedelta": timedelta, "fit": _fit(sizes.string or 0)}
    for n, (name, kind) in enumerate(schema.fields):
        if kind in _EXPRESSIONS:
            expression = _EXPRESSIONS[kind].format(n=n)
            if kind == "string" and sizes.string:
                expression = f"fit({expression})"
        else:
            values[f"g{n}"] = value_of(kind, name, sizes)
            expression = f"g{n}(i)"
        parts.append(expression)
        values[f"p{n}"] = f"{name}-"
    body = f"lambda ids: [({', '.join(parts)},) for i in ids]"
    return eval(body, values)  # noqa: S307 - generated from the fixed templates above


#: The kinds ``column_builder`` makes as columns: each value is arithmetic on the row id.
_COLUMN_KINDS = frozenset(("int", "bigint", "double", "float", "decimal", "string", "boolean"))
_EPOCH_US = int(EPOCH.timestamp() * 1_000_000)


def column_builder(schema: Schema, sizes: Sizes | None = None):
    """A function from a range of row ids to an Arrow batch of the values ``row_builder``
    makes, column by column (no Python row); None if a field's kind is not one it builds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from engine.connectors.arrowrows import arrow_schema

    sizes = sizes or Sizes()
    if not all(k in _COLUMN_KINDS or k == "timestamp" for k in schema.kinds):
        return None
    target = arrow_schema(schema)
    counting: list[pa.Array] = [pa.array([], pa.int64())]

    def positions(n: int) -> pa.Array:
        if len(counting[0]) < n:  # 0..n-1, built once per size and sliced after
            counting[0] = pa.array(range(max(n, 2 * len(counting[0]))), pa.int64())
        return counting[0].slice(0, n)

    def build(ids: range):
        n = len(ids)
        id_column = pc.add(pc.multiply(positions(n), ids.step), ids.start)
        columns = []
        for name, kind in schema.fields:
            if kind in ("int", "bigint"):
                column = id_column
            elif kind in ("double", "float", "decimal"):
                column = pc.multiply(id_column.cast(pa.float64()), 0.5)
            elif kind == "boolean":
                column = pc.equal(pc.bit_wise_and(id_column, 1), 0)
            elif kind == "timestamp":
                micros = pc.add(pc.multiply(id_column, 1_000_000), _EPOCH_US)
                column = micros.cast(pa.timestamp("us"))
            else:
                column = pc.binary_join_element_wise(f"{name}-", id_column.cast(pa.string()), "")
                if sizes.string:
                    padded = pc.utf8_rpad(column, width=sizes.string, padding="x")
                    column = pc.utf8_slice_codeunits(padded, start=-sizes.string)
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=target)

    return build


class RowsOption(Option):
    """SeaTunnel's ``rows`` list. Keel's own ``rows.per-second`` makes ``rows`` an object in
    HOCON: that is not a rows list, and leaves the option unset."""

    def coerce(self, value):
        return None if isinstance(value, dict) else super().coerce(value)


@register
class FakeSource(SourcePlugin):
    name = "FakeSource"
    options = (
        Option("schema", dict, help="schema { fields { name = type } }; default id, name, value"),
        Option("row.num", int, default=100, min=0, help="rows per split (BATCH)"),
        Option("split.num", int, default=1, min=1, help="number of splits"),
        Option(
            "rows.per-second",  # paces BATCH splits too (tests and demos of long batch jobs)
            float,
            default=0.0,
            min=0,
            help="rows per second per split (0: as fast as possible)",
        ),
        Option("string.length", int, default=None, min=1, help="length of every string value"),
        Option("split.read-interval", int, default=0, min=0, help="ms between a split's reads"),
        Option("bytes.length", int, default=5, min=1, help="length of every bytes value"),
        Option("array.size", int, default=5, min=0, help="items of every array"),
        Option("map.size", int, default=5, min=0, help="entries of every map"),
        Option(
            "tables_configs",
            list,
            help="[{ schema { table, fields }, row.num ... }]: a pipeline each",
        ),
        RowsOption(
            "rows", list, help="the rows each split emits: [{kind = INSERT, fields = [...]}]"
        ),
    )
    #: Runs in the managed lane (Lane A) when allowed (engine.connectors.managed).
    managed_capability = ManagedSourceCapability()
    ignored_options = (
        {
            f"{kind}.{option}": "values are derived from the row id, so a replay is exact"
            for kind in ("tinyint", "smallint", "int", "bigint", "float", "double", "string")
            for option in ("fake.mode", "min", "max", "template")
        }
        | {
            f"{part}.template": "values are derived from the row id, so a replay is exact"
            for part in ("date.year", "date.month", "date.day", "time.hour", "time.minute")
        }
        | {"time.second.template": "values are derived from the row id, so a replay is exact"}
    )

    @classmethod
    def check(cls, config):
        schema, errors = parse_schema(config.get("schema"))
        if errors or config["rows"] is None:
            return errors
        schema = schema or DEFAULT_SCHEMA
        for n, row in enumerate(config["rows"]):
            fields = row.get("fields") if isinstance(row, dict) else None
            kind = str(row.get("kind", "INSERT")).upper() if isinstance(row, dict) else ""
            if not isinstance(fields, list):
                errors.append((f"rows[{n}]", "must be { kind = INSERT, fields = [...] }"))
            elif kind not in ROW_KINDS:
                errors.append((f"rows[{n}].kind", f"must be one of {', '.join(ROW_KINDS)}"))
            elif len(fields) != len(schema.fields):
                errors.append(
                    (
                        f"rows[{n}].fields",
                        f"has {len(fields)} values, the schema {len(schema.fields)}",
                    )
                )
            else:
                try:
                    [convert(k, v) for (_, k), v in zip(schema.fields, fields, strict=True)]
                except (ValueError, TypeError, ArithmeticError) as exc:
                    errors.append((f"rows[{n}].fields", f"does not fit the schema: {exc}"))
        return errors

    def sizes(self) -> Sizes:
        config = self.config
        return Sizes(
            config["string.length"],
            config.get("bytes.length") or 5,
            config.get("array.size", 5),
            config.get("map.size", 5),
        )

    def listed_rows(self) -> list[tuple] | None:
        """The ``rows`` option's rows, typed; None if the option is not set."""
        if self.config.get("rows") is None:
            return None
        schema = self.output_schema()
        out = []
        for row in self.config["rows"]:
            values = tuple(
                convert(k, v) for (_, k), v in zip(schema.fields, row["fields"], strict=True)
            )
            out.append(with_kind(values, str(row.get("kind", "INSERT")).upper()))
        return out

    def output_schema(self) -> Schema:
        schema, _ = parse_schema(self.config.get("schema"))
        return schema or DEFAULT_SCHEMA

    def create_splits(self, mode: str) -> list[dict]:
        return [{"splitId": f"fake-{s}", "index": s} for s in range(self.config["split.num"])]

    def row_ids(self, split: dict, mode: str, start: int, stop: int) -> range:
        s, per, count = split["index"], self.config["row.num"], self.config["split.num"]
        if mode == JobMode.STREAMING:
            return range(s + start * count, s + stop * count, count)
        return range(s * per + start, s * per + stop)

    def read_rows(self, split: dict, offset: int, mode: str, batch_size: int):
        listed = self.listed_rows()
        if listed is not None:  # the same rows from every split, then the split ends
            if listed[offset:]:
                yield listed[offset:], len(listed)
            return
        build = row_builder(self.output_schema(), self.sizes())
        for ids, next_offset in self.id_ranges(split, offset, mode, batch_size):
            yield (build(ids) if ids is not None else []), next_offset

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Columns built from each batch's row ids with Arrow's compute functions, for the
        types whose values are arithmetic on the id (the values ``row_builder`` makes); other
        schemas, and the ``rows`` option, go through rows."""
        schema = self.output_schema()
        build = column_builder(schema, self.sizes())
        if build is None or self.config.get("rows") is not None:
            yield from super().read(split, offset, mode, batch_size)
            return
        empty = build(range(0))
        if self.config["split.read-interval"]:  # a read's rows, as the row path (and Lane A)
            batch_size = min(batch_size, ROW_SOURCE_BATCH)
        for ids, next_offset in self.id_ranges(split, offset, mode, batch_size):
            yield (build(ids) if ids is not None else empty), next_offset

    def id_ranges(self, split: dict, offset: int, mode: str, batch_size: int):
        """Yield ``(ids, next_offset)``: the row ids of the split's next batch, or None when
        nothing is due yet (pacing)."""
        streaming = mode == JobMode.STREAMING
        rate = self.config["rows.per-second"]
        interval = self.config["split.read-interval"] / 1000
        limit = None if streaming else self.config["row.num"]
        started, produced, next_read = time.monotonic(), 0, 0.0
        while limit is None or offset < limit:
            if interval and next_read > time.monotonic():
                yield None, offset  # the split's next read is not due yet
                continue
            stop = offset + batch_size if limit is None else min(offset + batch_size, limit)
            if rate > 0:
                stop = min(stop, offset + max(int(rate / 10), 1))
                due = started + produced / rate
                if due > time.monotonic():
                    yield None, offset  # nothing due yet: the runtime waits, then asks again
                    continue
            ids = self.row_ids(split, mode, offset, stop)
            produced += len(ids)
            offset = stop
            next_read = time.monotonic() + interval
            yield ids, offset
