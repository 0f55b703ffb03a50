"""FakeSource: deterministic rows from a declared schema, split by split, replayable by offset.

As in SeaTunnel, ``row.num`` is rows per reader: each of the pipeline's ``parallelism`` readers
gets ``row.num`` rows cut into splits of ``ceil(row.num / split.num)`` (``split_layout``), so
a job makes ``parallelism x row.num`` rows. Reader ``r``'s rows have the ids
``r * row.num ...``, so a job's rows are known in advance (tests compare exact row sets). A
STREAMING job makes the same rows and then idles, as SeaTunnel's does. Keel's own ``endless``
makes a STREAMING source whose splits never end (demos, recovery tests): ``split.num`` of
them, ids ``s + i * split.num`` (unique across splits), paced at ``rows.per-second`` a split.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.connectors.base import Option, SourcePlugin, table_names
from engine.connectors.batches import ROW_SOURCE_BATCH
from engine.connectors.fake_values import Sizes, column_builder, row_builder, vector_values
from engine.connectors.registry import register
from engine.connectors.schema import VECTOR_TYPES, Schema, convert, parse_schema, with_kind
from engine.sourceruntime.capability import ManagedSourceCapability
from engine.states import JobMode

#: SeaTunnel's row kinds (a changelog's). Keel's sinks write every row as data; the kind is
#: kept on the row for FilterRowKind.
ROW_KINDS = ("INSERT", "UPDATE_BEFORE", "UPDATE_AFTER", "DELETE")
DEFAULT_SCHEMA = Schema((("id", "bigint"), ("name", "string"), ("value", "double")))


def split_layout(readers: int, per_reader: int, split_num: int) -> list[tuple[int, int]]:
    """SeaTunnel's FakeSource splits as ``(first row id, rows)``, in its split-id order.

    Each reader gets ``per_reader`` rows in splits of ``ceil(per_reader / split_num)`` rows,
    the last one shorter (so fewer than ``split_num`` splits when that does not divide
    evenly); reader ``r``'s ``j``-th split has the id ``j * readers + r``. Reader ``r``'s rows
    have the ids ``r * per_reader`` up to the next reader's."""
    if per_reader <= 0:
        return []
    size = -(-per_reader // split_num)
    return [
        (r * per_reader + start, min(size, per_reader - start))
        for start in range(0, per_reader, size)
        for r in range(readers)
    ]


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
        Option("row.num", int, default=5, min=0, help="rows per reader (BATCH), as SeaTunnel"),
        Option("split.num", int, default=1, min=1, help="splits per reader"),
        Option(
            "endless",
            bool,
            default=False,
            help="STREAMING: keep making rows without end, ids continuing, split.num splits "
            "in all; SeaTunnel's FakeSource stops after row.num per reader",
        ),
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
        Option("vector.dimension", int, default=4, min=1, help="floats of every vector"),
        Option(
            "binary.vector.dimension", int, default=8, min=8, help="bits of every binary vector"
        ),
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
        | {
            name: "values are derived from the row id, so a replay is exact"
            for name in (
                "time.second.template",
                "vector.float.min",
                "vector.float.max",
                "auto.increment.enabled",
                "auto.increment.start",
            )
        }
        | {
            "table-names": "the rows go to one table, as SeaTunnel's FakeSource reads them; "
            "name several in tables_configs"
        }
    )
    tables_option = "tables_configs"

    @classmethod
    def table_entry_problem(cls, entry):
        schema = entry.get("schema") if isinstance(entry, dict) else None
        described = isinstance(schema, dict) and (schema.get("fields") or schema.get("columns"))
        if not described or not schema.get("table"):
            return "needs schema { table = name, fields { ... } (or columns = [...]) }"
        return None

    @classmethod
    def placeholder_names(cls, config):
        """Its ``schema.table`` (``database.table`` or ``table``) names the table; without one,
        its ``plugin_output``, else ``default.default.default``: SeaTunnel's catalog table, so
        ``path = ".../${table_name}"`` after ``plugin_output = "fake"`` is ``.../fake``."""
        schema = config.get("schema")
        table = schema.get("table") if isinstance(schema, dict) else None
        return table_names(str(table or config.get("plugin_output") or "default.default.default"))

    @classmethod
    def check(cls, config):
        schema, errors = parse_schema(config.get("schema"))
        if (config.get("binary.vector.dimension") or 8) % 8:
            errors.append(("binary.vector.dimension", "must be a multiple of 8 (bits a byte)"))
        if not errors and schema is not None:
            try:
                cls(config, "").fixed_values()
            except (ValueError, TypeError, ArithmeticError) as exc:
                errors.append(("schema.columns", f"a defaultValue does not fit its type: {exc}"))
        if config.get("endless") and config["rows"] is not None:
            errors.append(("endless", "makes rows from ids: listed rows come once a split"))
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
            self.fixed_values(),
        )

    def fixed_values(self) -> tuple[tuple[str, Callable], ...]:
        """The fields whose values are not their type's, as SeaTunnel makes them: a column's
        ``defaultValue`` in every row, and a vector sized by its ``columnScale`` (else
        ``vector.dimension``, ``binary.vector.dimension`` for a binary one)."""
        tree = self.config.get("schema") or {}
        fields = tree.get("fields")
        columns = [{"name": n, "type": k} for n, k in fields.items()] if fields else None
        kinds, out = dict(self.output_schema().fields), []
        for column in columns or tree.get("columns") or []:
            name, declared = str(column["name"]), column["type"]
            kind = declared.strip().lower() if isinstance(declared, str) else ""
            default = column.get("defaultValue")
            if default is not None and not str(default).upper().startswith("CURRENT_"):
                value = convert(kinds[name], default)
                out.append((name, lambda i, value=value: value))
            elif kind in VECTOR_TYPES:
                binary = kind == "binary_vector"
                dimension = column.get("columnScale") or self.config.get(
                    "binary.vector.dimension" if binary else "vector.dimension"
                )
                out.append((name, vector_values(kind, int(dimension or (8 if binary else 4)))))
        return tuple(out)

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

    @classmethod
    def mode_problems(cls, config: dict, mode: str) -> list[tuple[str, str]]:
        """``endless`` is for STREAMING jobs: a BATCH job's input has to end."""
        if config.get("endless") and mode != JobMode.STREAMING:
            return [("endless", "is for STREAMING jobs (a BATCH job's input ends)")]
        return []

    def endless(self, mode: str) -> bool:
        """Splits that never end: a STREAMING job's with Keel's ``endless`` (SeaTunnel's end
        after their rows, the job then idles). A job planned before the option was (no key)
        keeps the endless splits it was made with."""
        endless = self.config.get("endless", True) and self.config.get("rows") is None
        return mode == JobMode.STREAMING and bool(endless)

    def create_splits(self, mode: str) -> list[dict]:
        """SeaTunnel's splits, in the order of its split ids, so that assigning them round-robin
        gives split ``k`` to reader ``k % parallelism`` as its enumerator does; an ``endless``
        STREAMING source has ``split.num`` splits in all."""
        if self.endless(mode):
            return [{"splitId": f"fake-{s}", "index": s} for s in range(self.config["split.num"])]
        layout = split_layout(
            self.config.get("parallelism") or 1, self.config["row.num"], self.config["split.num"]
        )
        return [
            {"splitId": f"fake-{s}", "index": s, "first": first, "rows": rows}
            for s, (first, rows) in enumerate(layout)
        ]

    def split_rows(self, split: dict, mode: str) -> int | None:
        """How many rows the split holds: None if it never ends. Listed ``rows`` come once
        per split, as in SeaTunnel; a split made before splits said their rows has row.num."""
        if self.endless(mode):
            return None
        if self.config.get("rows") is not None:
            return len(self.config["rows"])
        return split.get("rows", self.config["row.num"])

    def row_ids(self, split: dict, mode: str, start: int, stop: int) -> range:
        s, per, count = split["index"], self.config["row.num"], self.config["split.num"]
        if self.endless(mode):
            return range(s + start * count, s + stop * count, count)
        first = split.get("first", s * per)
        return range(first + start, first + stop)

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
        rate = self.config["rows.per-second"]
        interval = self.config["split.read-interval"] / 1000
        limit = self.split_rows(split, mode)
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
