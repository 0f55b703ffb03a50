"""Transforms: FieldMapper (select, rename and order fields) and Filter (keep or drop fields),
as in SeaTunnel; RowFilter (keep rows whose field compares true to a value)."""

from __future__ import annotations

import operator

from engine.connectors.base import Option, TransformPlugin
from engine.connectors.registry import register
from engine.connectors.schema import Schema


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
        getter = operator.itemgetter(*[schema.index(s) for s in self.config["field_mapper"]])
        if len(self.config["field_mapper"]) == 1:
            return lambda rows: [(getter(r),) for r in rows]
        return lambda rows: [getter(r) for r in rows]


@register
class Filter(TransformPlugin):
    name = "Filter"
    options = (
        Option("include_fields", list, help="keep only these fields"),
        Option("exclude_fields", list, help="drop these fields"),
    )

    @classmethod
    def check(cls, config):
        if (config["include_fields"] is None) == (config["exclude_fields"] is None):
            return [("include_fields", "set exactly one of include_fields and exclude_fields")]
        return []

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
        idx = [schema.index(n) for n in self.kept(schema)]
        return lambda rows: [tuple(r[i] for i in idx) for r in rows]


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

    def processor(self, schema: Schema):
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
