"""FakeSource: deterministic rows from a declared schema, split by split, replayable by offset.

Row ``i`` of split ``s`` has the global id ``s * row.num + i`` in BATCH mode, so a job's rows are
known in advance (tests compare exact row sets). In STREAMING mode a split never ends: ids are
``s + i * split.num`` (unique across splits), paced at ``rows.per-second`` per split.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from . import register
from .base import Option, SourcePlugin
from .schema import Schema, parse_schema

DEFAULT_SCHEMA = Schema((("id", "bigint"), ("name", "string"), ("value", "double")))
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def _value(kind: str, name: str, row_id: int):
    if kind in ("int", "bigint"):
        return row_id
    if kind == "string":
        return f"{name}-{row_id}"
    if kind in ("double", "float", "decimal"):
        return row_id * 0.5
    if kind == "boolean":
        return row_id % 2 == 0
    return (EPOCH + timedelta(seconds=row_id)).isoformat()


@register
class FakeSource(SourcePlugin):
    name = "FakeSource"
    options = (
        Option("schema", dict, help="schema { fields { name = type } }; default id, name, value"),
        Option("row.num", int, default=100, min=0, help="rows per split (BATCH)"),
        Option("split.num", int, default=1, min=1, help="number of splits"),
        Option(
            "rows.per-second",
            float,
            default=0.0,
            min=0,
            help="pace per split in STREAMING mode (0: as fast as possible)",
        ),
    )

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
        if mode == "STREAMING":
            return range(s + start * count, s + stop * count, count)
        return range(s * per + start, s * per + stop)

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        schema = self.output_schema()
        columns = [(kind, name) for name, kind in schema.fields]
        streaming = mode == "STREAMING"
        rate = self.config["rows.per-second"]
        limit = None if streaming else self.config["row.num"]
        started, produced = time.monotonic(), 0
        while limit is None or offset < limit:
            stop = offset + batch_size if limit is None else min(offset + batch_size, limit)
            if streaming and rate > 0:
                stop = min(stop, offset + max(int(rate / 10), 1))
                due = started + produced / rate
                if due > time.monotonic():
                    yield [], offset  # nothing due yet: the runtime waits, then asks again
                    continue
            ids = self.row_ids(split, mode, offset, stop)
            rows = [tuple(_value(kind, name, i) for kind, name in columns) for i in ids]
            produced += len(rows)
            offset = stop
            yield rows, offset
