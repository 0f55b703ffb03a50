"""Transforms: FieldMapper (select, rename and order fields), Filter (keep or drop fields), Copy,
Replace and FilterRowKind, as in SeaTunnel; RowFilter (keep rows whose field compares true to a
value). The Sql transform is in ``sql``."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.arrowrows import rows_of
from engine.connectors.base import Option, TransformPlugin
from engine.connectors.batches import ROW_KIND, ROW_KINDS, kinds
from engine.connectors.re2syntax import re2_pattern, re2_rewrite
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
#: The same comparisons on whole columns.
_COLUMN_OPS = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
#: How RowFilter converts its value for a field of each kind; any other kind compares it as
#: the string it is.
_VALUE_TYPES = {
    "tinyint": int,
    "smallint": int,
    "int": int,
    "bigint": int,
    "double": float,
    "float": float,
    "decimal": float,
}
#: Kinds whose row values are strings (times as their ISO text), so a string value orders
#: against them; against any other kind it is only ever unequal.
_TEXT_KINDS = ("string", "timestamp", "date", "time")
_INT64 = (-(2**63), 2**63 - 1)


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

    def comparison(self, schema: Schema) -> tuple[int, str, str, Callable[[str], object]]:
        """(the field's index, its kind, the operator, the value's conversion)."""
        field = self.config["field"]
        kind = dict(schema.fields)[field]
        # A decimal with a precision compares exactly (a Decimal), a plain one as a number.
        convert = Decimal if kind.startswith("decimal(") else _VALUE_TYPES.get(kind, str)
        return schema.index(field), kind, self.config["op"], convert

    def processor(self, schema: Schema):
        index, kind, op, convert = self.comparison(schema)
        raw = self.config["value"]

        def process(batch: pa.RecordBatch) -> pa.RecordBatch:
            value = convert(raw)  # raises (and fails the task) if the value does not convert
            return batch.filter(compare(batch.column(index), kind, op, value))

        return process

    def row_processor(self, schema: Schema):
        """The row model's RowFilter: what ``processor`` computes on columns, row by row."""
        index, _, op, convert = self.comparison(schema)
        raw, test = self.config["value"], _OPS[op]

        def process(rows):
            value = convert(raw)  # raises (and fails the task) if the value does not convert
            # SQL semantics: a NULL (None) compares as neither true nor false: the row goes.
            return [r for r in rows if r[index] is not None and test(r[index], value)]

        return process


def compare(column: pa.Array, kind: str, op: str, value) -> pa.Array:
    """Where ``column <op> value`` holds as Python compares the column's row values (a null
    never holds): on the whole column where Arrow's comparison agrees with Python's, else value
    by value (which raises where Python does)."""
    mask = _column_compare(column, kind, op, value)
    return mask if mask is not None else _python_compare(column, kind, op, value)


def _column_compare(column: pa.Array, kind: str, op: str, value) -> pa.Array | None:
    """The comparison with Arrow's kernels, or None where they could answer otherwise than
    Python (an ordering between a string and a number raises in Python)."""
    arrow_type = column.type
    if isinstance(value, int) and pa.types.is_signed_integer(arrow_type):
        if not _INT64[0] <= value <= _INT64[1]:  # beyond every int64: the same for all rows
            return _every_valid(column, _OPS[op](0, value))
        return _COLUMN_OPS[op](column, pa.scalar(value, pa.int64()))
    if isinstance(value, Decimal) and pa.types.is_decimal(arrow_type) and value.is_finite():
        try:
            return _COLUMN_OPS[op](column, pa.scalar(value))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # beyond Arrow's decimals: value by value
    if isinstance(value, float) and pa.types.is_floating(arrow_type):
        return _COLUMN_OPS[op](column.cast(pa.float64()), pa.scalar(value, pa.float64()))
    if not isinstance(value, str):
        return None
    if kind not in _TEXT_KINDS:  # a string is unequal to every other Python value
        return _every_valid(column, op == "!=") if op in ("==", "!=") else None
    text = column if kind == "string" else iso_text(column)
    if text is None or not (pa.types.is_string(text.type) and _utf8(value)):
        return None
    return _COLUMN_OPS[op](text, pa.scalar(value, pa.string()))


def _every_valid(column: pa.Array, holds: bool) -> pa.Array:
    """A mask that selects every non-null row when ``holds``, else none."""
    return pc.is_valid(column) if holds else pa.nulls(len(column), pa.bool_())


def _python_compare(column: pa.Array, kind: str, op: str, value) -> pa.Array:
    """The row model's comparison on the column's row values, one by one."""
    test = _OPS[op]
    values = rows_of(pa.Table.from_arrays([column], names=["v"]), Schema((("v", kind),)))
    return pa.array([v is not None and test(v, value) for (v,) in values], pa.bool_())


#: What ``iso_text`` formats: Arrow's text for them differs from ``isoformat`` only by the
#: date-time separator and a zero fraction of a second.
_ISO_TYPES = (pa.timestamp("us"), pa.date32(), pa.time64("us"))


def iso_text(column: pa.Array) -> pa.Array | None:
    """A time column as the row model's ISO strings (``datetime.isoformat``: a ``T`` between
    date and time, no fraction when it is zero), or None for a type it does not format."""
    if column.type not in _ISO_TYPES:
        return None
    text = column.cast(pa.string())  # "2024-01-02 03:04:05.000000"
    if pa.types.is_date(column.type):
        return text
    if pa.types.is_timestamp(column.type):
        text = pc.binary_replace_slice(text, start=10, stop=11, replacement="T")
    whole = pc.ends_with(text, ".000000")
    return pc.if_else(whole, pc.utf8_slice_codeunits(text, 0, -7), text)


def _utf8(text: str) -> bool:
    """Whether Arrow can hold ``text`` as a string (a lone surrogate it cannot)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


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

    def replacer(self) -> Callable[[str], str]:
        """The replacement of one value, as Python does it (the row model's, and the batch
        path's where Arrow's kernels could answer otherwise)."""
        count = int(self.config["replace_first"])
        if self.config["is_regex"]:
            pattern = re.compile(self.config["pattern"])
            replacement = java_replacement(self.config["replacement"])
            return lambda value: pattern.sub(replacement, value, count=count)
        old, new = self.config["pattern"], self.config["replacement"]
        return lambda value: value.replace(old, new, 1 if count else -1)

    def column_replacer(self) -> Callable[[pa.Array], pa.Array | None] | None:
        """The replacement of a whole column with Arrow's kernels, or None where they could
        answer otherwise than Python (the function itself answers None for a column it
        cannot do)."""
        old, new = self.config["pattern"], self.config["replacement"]
        most = 1 if self.config["replace_first"] else None
        if self.config["is_regex"]:
            return _regex_replacer(old, java_replacement(new), most)
        if not old or not (_utf8(old) and _utf8(new)):  # Arrow has no empty-pattern rule
            return None
        return lambda column: pc.replace_substring(column, old, new, max_replacements=most)

    def processor(self, schema: Schema):
        index = schema.index(self.config["replace_field"])
        on_column, on_value = self.column_replacer(), self.replacer()

        def process(batch: pa.RecordBatch) -> pa.RecordBatch:
            column = batch.column(index)
            replaced = on_column(column) if on_column is not None else None
            if replaced is None:
                replaced = _each_value(column, on_value)
            return batch.set_column(index, batch.schema.field(index), replaced)

        return process

    def row_processor(self, schema: Schema):
        """The row model's Replace: what ``processor`` computes on columns, row by row."""
        index, replace = schema.index(self.config["replace_field"]), self.replacer()

        def process(rows):
            return [
                r
                if r[index] is None
                else with_kind((*r[:index], replace(r[index]), *r[index + 1 :]), row_kind(r))
                for r in rows
            ]

        return process


def _regex_replacer(
    pattern: str, replacement: str, most: int | None
) -> Callable[[pa.Array], pa.Array | None] | None:
    """``re.sub(pattern, replacement)`` on whole columns with RE2, or None where RE2 could
    answer otherwise (``engine.connectors.re2syntax``)."""
    translated = re2_pattern(pattern)
    rewrite = re2_rewrite(re.compile(pattern), replacement)
    if (
        translated is None
        or rewrite is None
        or (translated.repeated_groups and rewrite[1])
        or (translated.anchored and most is not None)
    ):
        return None
    try:  # RE2 refuses what it cannot compile (a size limit): Python answers instead
        pc.replace_substring_regex(pa.array([""]), translated.text, rewrite[0])
    except pa.ArrowInvalid:
        return None

    def replace(column: pa.Array) -> pa.Array | None:
        if translated.ascii_only and pc.all(pc.string_is_ascii(column)).as_py() is False:
            return None
        return pc.replace_substring_regex(
            column, translated.text, rewrite[0], max_replacements=most
        )

    return replace


def _each_value(column: pa.Array, fn: Callable[[str], str]) -> pa.Array:
    """``fn`` applied to every non-null value of a string column."""
    return pa.array([None if v is None else fn(v) for v in column.to_pylist()], column.type)


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
