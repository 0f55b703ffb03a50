"""Transforms: FieldMapper (select, rename and order fields), Filter (keep or drop fields), Copy,
Replace and FilterRowKind, as in SeaTunnel; RowFilter (keep rows whose field compares true to a
value). The Sql transform is in ``sql``."""

from __future__ import annotations

import operator
import re

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.base import Option, TransformPlugin
from engine.connectors.batches import ROW_KIND, ROW_KINDS, kinds
from engine.connectors.registry import register
from engine.connectors.schema import Schema, row_kind, with_kind


@register
class FieldMapper(TransformPlugin):
    name = "FieldMapper"
    options = (
        Option(
            "field_mapper",
            dict,
            required=True,
            help="field_mapper { source_field = target_field }, in output order",
        ),
    )

    @classmethod
    def check(cls, config):
        mapping = config["field_mapper"]
        if not mapping:
            return [("field_mapper", "must map at least one field")]
        bad = [k for k, v in mapping.items() if not isinstance(v, str) or not v]
        return [(f"field_mapper.{k}", "target must be a field name") for k in bad]

    def output_schema(self, schema: Schema) -> Schema:
        types = dict(schema.fields)
        missing = [src for src in self.config["field_mapper"] if src not in types]
        if missing:
            raise ValueError(f"field_mapper names unknown input field(s): {', '.join(missing)}")
        return Schema(tuple((dst, types[src]) for src, dst in self.config["field_mapper"].items()))

    def processor(self, schema: Schema):
        picks = [schema.index(s) for s in self.config["field_mapper"]]
        return project(picks, list(self.config["field_mapper"].values()))


def project(picks: list[int], names: list[str]):
    """A batch's columns at ``picks`` (a column may be picked twice), named ``names``; the
    row kind column goes along. Whole columns: no row is touched."""

    def process(batch):
        columns = [batch.column(i) for i in picks]
        codes = kinds(batch)
        if codes is not None:
            columns, names_out = [*columns, codes], [*names, ROW_KIND]
        else:
            names_out = names
        return pa.RecordBatch.from_arrays(columns, names=names_out)

    return process


def include_or_exclude(config: dict, what: str) -> tuple[str | None, list[tuple[str, str]]]:
    """Which of ``include_<what>`` and ``exclude_<what>`` is set: exactly one must be."""
    include, exclude = f"include_{what}", f"exclude_{what}"
    if (config[include] is None) == (config[exclude] is None):
        return None, [(include, f"set exactly one of {include} and {exclude}")]
    return (include if config[include] is not None else exclude), []


@register
class Filter(TransformPlugin):
    name = "Filter"
    options = (
        Option("include_fields", list, help="keep only these fields"),
        Option("exclude_fields", list, help="drop these fields"),
    )

    @classmethod
    def check(cls, config):
        return include_or_exclude(config, "fields")[1]

    def kept(self, schema: Schema) -> list[str]:
        include, exclude = self.config["include_fields"], self.config["exclude_fields"]
        names = schema.names
        listed = include if include is not None else exclude
        missing = [f for f in listed if f not in names]
        if missing:
            raise ValueError(f"unknown input field(s): {', '.join(map(str, missing))}")
        if include is not None:
            return [n for n in names if n in include]
        return [n for n in names if n not in exclude]

    def output_schema(self, schema: Schema) -> Schema:
        types = dict(schema.fields)
        return Schema(tuple((n, types[n]) for n in self.kept(schema)))

    def processor(self, schema: Schema):
        kept = self.kept(schema)
        return project([schema.index(n) for n in kept], kept)


_OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@register
class RowFilter(TransformPlugin):
    """Keep rows where ``field <op> value``; a comparison that raises fails the task."""

    name = "RowFilter"
    options = (
        Option("field", str, required=True),
        Option("op", str, default="==", choices=tuple(_OPS)),
        Option("value", str, required=True, help="compared after conversion to the field type"),
    )

    def output_schema(self, schema: Schema) -> Schema:
        if self.config["field"] not in schema.names:
            raise ValueError(f"unknown input field: {self.config['field']}")
        return schema

    def row_processor(self, schema: Schema):
        index = schema.index(self.config["field"])
        kind = dict(schema.fields)[self.config["field"]]
        raw = self.config["value"]
        convert = {
            "int": int,
            "bigint": int,
            "double": float,
            "float": float,
            "decimal": float,
        }.get(kind, str)
        op = _OPS[self.config["op"]]

        def process(rows):
            value = convert(raw)  # raises (and fails the task) if the value does not convert
            # SQL semantics: a NULL (None) compares as neither true nor false: the row goes.
            return [r for r in rows if r[index] is not None and op(r[index], value)]

        return process


@register
class Copy(TransformPlugin):
    """New fields copied from existing ones, appended: ``fields { copy = source }`` (or
    SeaTunnel's older ``src_field`` and ``dest_field``)."""

    name = "Copy"
    options = (
        Option("fields", dict, help="fields { new_field = existing_field }"),
        Option("src_field", str, help="the field to copy (older form)"),
        Option("dest_field", str, help="the new field's name (older form)"),
    )

    @classmethod
    def check(cls, config):
        if config["fields"] is None and (config["src_field"] is None or not config["dest_field"]):
            return [("fields", "set fields { new = existing } (or src_field and dest_field)")]
        bad = [k for k, v in (config["fields"] or {}).items() if not isinstance(v, str)]
        return [(f"fields.{k}", "must name an existing field") for k in bad]

    def copies(self) -> dict[str, str]:
        copies = dict(self.config["fields"] or {})
        if self.config["src_field"] is not None:
            copies[self.config["dest_field"]] = self.config["src_field"]
        return copies

    def output_schema(self, schema: Schema) -> Schema:
        types = dict(schema.fields)
        for new, existing in self.copies().items():
            if existing not in types:
                raise ValueError(f"fields.{new}: unknown input field {existing}")
            if new in types:
                raise ValueError(f"fields.{new}: the input already has a field {new}")
        return Schema(schema.fields + tuple((n, types[e]) for n, e in self.copies().items()))

    def processor(self, schema: Schema):
        copies = self.copies()
        picks = list(range(len(schema.names))) + [schema.index(e) for e in copies.values()]
        return project(picks, [*schema.names, *copies])


def java_replacement(text: str) -> str:
    """SeaTunnel's (Java's) ``$1`` group references as Python's ``\\g<1>``."""
    return re.sub(r"\$(\d+)", r"\\g<\1>", text)


@register
class Replace(TransformPlugin):
    """Replace text in a string field: a literal or a regular expression, every match or the
    first."""

    name = "Replace"
    options = (
        Option("replace_field", str, required=True),
        Option("pattern", str, required=True),
        Option("replacement", str, required=True),
        Option("is_regex", bool, default=False),
        Option("replace_first", bool, default=False, help="only the first match"),
    )

    @classmethod
    def check(cls, config):
        if config["is_regex"]:
            try:
                pattern = re.compile(config["pattern"])
            except re.error as exc:
                return [("pattern", f"not a regular expression: {exc}")]
            try:  # Python checks a replacement's escapes and groups before any match
                pattern.sub(java_replacement(config["replacement"]), "")
            except re.error as exc:
                return [("replacement", str(exc))]
        return []

    def output_schema(self, schema: Schema) -> Schema:
        field = self.config["replace_field"]
        if field not in schema.names:
            raise ValueError(f"replace_field: unknown input field {field}")
        if dict(schema.fields)[field] != "string":
            raise ValueError(f"replace_field: {field} is not a string field")
        return schema

    def row_processor(self, schema: Schema):
        index, count = schema.index(self.config["replace_field"]), int(self.config["replace_first"])
        if self.config["is_regex"]:
            pattern = re.compile(self.config["pattern"])
            replacement = java_replacement(self.config["replacement"])

            def replace(value: str) -> str:
                return pattern.sub(replacement, value, count=count)
        else:
            old, new = self.config["pattern"], self.config["replacement"]

            def replace(value: str) -> str:
                return value.replace(old, new, 1 if count else -1)

        def process(rows):
            return [
                r
                if r[index] is None
                else with_kind((*r[:index], replace(r[index]), *r[index + 1 :]), row_kind(r))
                for r in rows
            ]

        return process


@register
class FilterRowKind(TransformPlugin):
    """Keep or drop rows by changelog kind. Keel's rows are INSERT unless a FakeSource ``rows``
    entry says otherwise."""

    name = "FilterRowKind"
    options = (
        Option("include_kinds", list, help="keep only rows of these kinds"),
        Option("exclude_kinds", list, help="drop rows of these kinds"),
    )

    @classmethod
    def check(cls, config):
        from engine.connectors.fake import ROW_KINDS

        option, errors = include_or_exclude(config, "kinds")
        if errors:
            return errors
        unknown = [k for k in config[option] if str(k).upper() not in ROW_KINDS]
        if unknown:
            return [(option, f"unknown kinds {unknown} (known: {', '.join(ROW_KINDS)})")]
        return []

    def output_schema(self, schema: Schema) -> Schema:
        return schema

    def processor(self, schema: Schema):
        include = self.config["include_kinds"] is not None
        wanted = {
            str(k).upper() for k in self.config["include_kinds" if include else "exclude_kinds"]
        }
        codes = pa.array(sorted(ROW_KINDS[k] for k in wanted), pa.int8())

        def process(batch):
            present = kinds(batch)
            if present is None:  # every row an INSERT
                return batch if ("INSERT" in wanted) == include else batch.slice(0, 0)
            mask = pc.is_in(present, value_set=codes)
            return batch.filter(mask if include else pc.invert(mask))

        return process
