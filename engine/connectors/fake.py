"""FakeSource: deterministic rows from a declared schema, split by split, replayable by offset.

Row ``i`` of split ``s`` has the global id ``s * row.num + i`` in BATCH mode, so a job's rows are
known in advance (tests compare exact row sets). In STREAMING mode a split never ends: ids are
``s + i * split.num`` (unique across splits), paced at ``rows.per-second`` per split.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from engine.connectors.base import Option, SourcePlugin
from engine.connectors.registry import register
from engine.connectors.schema import Schema, parse_schema
from engine.states import JobMode

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


def row_builder(schema: Schema, string_length: int | None = None):
    """A function from a range of row ids to rows, compiled for the schema.

    The comprehension is generated from fixed templates (user-given field names are passed in as
    values, never as code), so generation costs what a hand-written loop costs.
    """
    parts, values = [], {"EPOCH": EPOCH, "timedelta": timedelta, "fit": _fit(string_length or 0)}
    for n, (name, kind) in enumerate(schema.fields):
        expression = _EXPRESSIONS[kind].format(n=n)
        if kind == "string" and string_length:
            expression = f"fit({expression})"
        parts.append(expression)
        values[f"p{n}"] = f"{name}-"
    body = f"lambda ids: [({', '.join(parts)},) for i in ids]"
    return eval(body, values)  # noqa: S307 - generated from the fixed templates above


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
    )
    ignored_options = {
        key: "Keel's FakeSource schema has no bytes, array or map types yet"
        for key in ("bytes.length", "array.size", "map.size")
    }

    @classmethod
    def check(cls, config):
        _, errors = parse_schema(config.get("schema"))
        return errors

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

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        build = row_builder(self.output_schema(), self.config["string.length"])
        streaming = mode == JobMode.STREAMING
        rate = self.config["rows.per-second"]
        interval = self.config["split.read-interval"] / 1000
        limit = None if streaming else self.config["row.num"]
        started, produced, next_read = time.monotonic(), 0, 0.0
        while limit is None or offset < limit:
            if interval and next_read > time.monotonic():
                yield [], offset  # the split's next read is not due yet
                continue
            stop = offset + batch_size if limit is None else min(offset + batch_size, limit)
            if rate > 0:
                stop = min(stop, offset + max(int(rate / 10), 1))
                due = started + produced / rate
                if due > time.monotonic():
                    yield [], offset  # nothing due yet: the runtime waits, then asks again
                    continue
            ids = self.row_ids(split, mode, offset, stop)
            rows = build(ids)
            produced += len(rows)
            offset = stop
            next_read = time.monotonic() + interval
            yield rows, offset
