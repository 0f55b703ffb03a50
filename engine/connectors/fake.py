"""FakeSource: deterministic rows from a declared schema, split by split, replayable by offset.

Row ``i`` of split ``s`` has the global id ``s * row.num + i`` in BATCH mode, so a job's rows are
known in advance (tests compare exact row sets). In STREAMING mode a split never ends: ids are
``s + i * split.num`` (unique across splits), paced at ``rows.per-second`` per split.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.arrowrows import arrow_schema
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
_COLUMN_KINDS = frozenset(
    ("int", "bigint", "double", "float", "decimal", "string", "boolean", "timestamp")
)
_EPOCH_US = int(EPOCH.timestamp() * 1_000_000)
#: Ids whose text differs only in its last four digits come in blocks of this many.
_BLOCK = 10_000
#: Above this step between ids a text column's runs of shared leading digits are too short to
#: pay for themselves; Arrow formats each id instead.
_RUN_STEP = 64


def column_builder(schema: Schema, sizes: Sizes | None = None):
    """A function from a range of row ids to an Arrow batch of the values ``row_builder``
    makes, column by column (no Python row); None if a field's kind is not one it builds."""
    sizes = sizes or Sizes()
    if not all(k in _COLUMN_KINDS for k in schema.kinds):
        return None
    target = arrow_schema(schema)
    counting = _Counting()

    def build(ids: range) -> pa.RecordBatch:
        n = len(ids)
        id_column = pc.add(counting.upto(n, ids.step), ids.start)
        columns = []
        for name, kind in schema.fields:
            if kind in ("int", "bigint"):
                column = id_column
            elif kind in ("double", "float", "decimal"):
                column = pc.multiply(id_column, 0.5)  # as Python's i * 0.5: i as a double
            elif kind == "boolean":
                column = pc.equal(pc.bit_wise_and(id_column, 1), 0)
            elif kind == "timestamp":
                micros = pc.add(pc.multiply(id_column, 1_000_000), _EPOCH_US)
                column = micros.cast(pa.timestamp("us"))
            else:
                column = text_column(ids, f"{name}-", sizes.string, counting)
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=target)

    return build


class _Counting:
    """``0, step, 2 * step, ...`` as Arrow arrays, built once per step and sliced after: the
    positions of a batch's ids and the offsets of its fixed-width strings."""

    def __init__(self) -> None:
        self.arrays: dict[tuple[int, object], pa.Array] = {}

    def upto(self, n: int, step: int, arrow_type=None) -> pa.Array:
        """The first ``n`` multiples of ``step`` (int64 unless ``arrow_type`` says)."""
        arrow_type = arrow_type or pa.int64()
        have = self.arrays.get((step, arrow_type))
        if have is None or len(have) < n:  # a batch's size: the same for every full batch
            counted = pa.array(range(n), arrow_type)
            have = pc.multiply_checked(counted, pa.scalar(step, arrow_type))
            self.arrays[(step, arrow_type)] = have
        return have.slice(0, n)


def text_column(ids: range, prefix: str, width: int | None, counting: _Counting) -> pa.Array:
    """``fit(f"{prefix}{i}")`` for every id (``fit``: padded or cut to ``width`` characters
    when it is set), as ``row_builder`` makes them, without formatting an id.

    The ids are cut into runs whose text shares all but its last (up to) four digits; a run's
    values then have one width, so its bytes are a repeated template with the digit positions
    filled from precomputed digit columns, and its offsets a multiple of that width."""
    if ids.step > _RUN_STEP:
        numbers = pc.add(counting.upto(len(ids), ids.step), ids.start).cast(pa.string())
        text = pc.binary_join_element_wise(prefix, numbers, "")
        if width:
            text = pc.utf8_slice_codeunits(pc.utf8_rpad(text, width=width, padding="x"), -width)
        return text
    runs = [_TextRun.of(run, prefix, width) for run in _runs(ids)]
    if len({run.size for run in runs}) <= 1:  # one width (always, with string.length)
        return _strings(runs, counting)
    return pa.concat_arrays([_strings([run], counting) for run in runs])


def _runs(ids: range) -> Iterator[range]:
    """``ids`` cut where more than an id's last four digits change: at every multiple of
    ``_BLOCK``, and below it where the number of digits changes."""
    done = 0
    while done < len(ids):
        first = ids[done]
        bound = (first // _BLOCK + 1) * _BLOCK if first >= _BLOCK else 10 ** len(str(first))
        count = min(len(ids) - done, -(-(bound - first) // ids.step))
        yield ids[done : done + count]
        done += count


@dataclass(frozen=True)
class _TextRun:
    """A run's values: each is ``head``, the id's last ``keep`` digits, then ``tail``."""

    ids: range
    head: bytes
    keep: int
    tail: bytes

    @classmethod
    def of(cls, ids: range, prefix: str, width: int | None) -> _TextRun:
        high, low = divmod(ids[0], _BLOCK)
        head, digits = prefix + (str(high) if high else ""), 4 if high else len(str(low))
        keep, tail = digits, ""
        if width and len(head) + digits <= width:
            tail = "x" * (width - len(head) - digits)
        elif width:  # fit keeps the last ``width`` characters
            keep = min(digits, width)
            head = head[len(head) - (width - keep) :] if width > keep else ""
        return cls(ids, head.encode(), keep, tail.encode())

    @property
    def size(self) -> int:
        return len(self.head) + self.keep + len(self.tail)

    def values(self) -> bytearray:
        """The run's bytes: the template repeated, then each digit position filled by one
        strided copy."""
        count, size, step = len(self.ids), self.size, self.ids.step
        data = bytearray(self.head + b"0" * self.keep + self.tail) * count
        low = self.ids[0] % _BLOCK
        lows = slice(low, low + count * step, step)
        for position, column in enumerate(_low_digits()[4 - self.keep :]):
            data[len(self.head) + position :: size] = column[lows]
        return data


def _strings(runs: list[_TextRun], counting: _Counting) -> pa.Array:
    """Runs of one width as one string array, built from its buffers."""
    count = sum(len(run.ids) for run in runs)
    size = runs[0].size if runs else 0
    parts = [run.values() for run in runs]
    data = parts[0] if len(parts) == 1 else b"".join(parts)  # b"" for no run
    offsets = counting.upto(count + 1, size, pa.int32())
    return pa.Array.from_buffers(
        pa.string(), count, [None, offsets.buffers()[1], pa.py_buffer(data)]
    )


@functools.cache
def _low_digits() -> tuple[bytes, ...]:
    """The four digits of 0000 ... 9999, one bytes object per digit position: byte ``r`` of
    the last one is the last digit of ``r``."""
    text = "".join(f"{r:04d}" for r in range(_BLOCK)).encode()
    return tuple(text[position::4] for position in range(4))


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
