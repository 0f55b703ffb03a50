"""FakeSource's values: each field's value is a function of the row id, so a replay from an
offset is exact and tests know every value in advance; rows are built by a comprehension
compiled for the schema (``row_builder``), or column by column with Arrow (``column_builder``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.arrowrows import arrow_schema
from engine.connectors.schema import Schema, kind_args, row_fields

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
    #: Fields whose values are not their type's: (name, function of the row id).
    fixed: tuple[tuple[str, Callable], ...] = ()


def vector_values(kind: str, dimension: int) -> Callable:
    """A SeaTunnel vector column's values, derived from the row id as every value is: a
    dense vector ``dimension`` floats, a binary one ``dimension / 8`` bytes, a sparse one
    ``dimension`` entries index -> value."""
    if kind == "binary_vector":
        return lambda i: bytes((i + k) % 256 for k in range(dimension // 8))
    if kind == "sparse_float_vector":
        return lambda i: {k: (i + k) * 0.5 for k in range(dimension)}
    return lambda i: [(i + k) * 0.5 for k in range(dimension)]


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
    fixed = dict(sizes.fixed)
    for n, (name, kind) in enumerate(schema.fields):
        if name in fixed:
            values[f"g{n}"] = fixed[name]
            expression = f"g{n}(i)"
        elif kind in _EXPRESSIONS:
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
    if sizes.fixed or not all(k in _COLUMN_KINDS for k in schema.kinds):
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
