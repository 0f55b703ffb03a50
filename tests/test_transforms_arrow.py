"""RowFilter and Replace work on Arrow batches: whatever the batch path keeps or replaces is what
the row model's path (``row_processor`` through the base class's row edge) does, nulls, row
kinds and raised errors included."""

from __future__ import annotations

import math
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connectors.base import TransformPlugin
from engine.connectors.batches import ROW_KIND, from_rows, kinds, to_rows
from engine.connectors.re2syntax import re2_pattern
from engine.connectors.schema import Schema, row_kind, with_kind
from engine.connectors.transforms import Replace, RowFilter, _column_compare
from tests.test_arrow_batches import TYPES as ALL_TYPES

#: The type table's kinds but smallint and map (the rows below have no values for them).
TYPES = Schema(tuple((n, k) for n, k in ALL_TYPES.fields if n not in ("s", "dict")))
ROWS = [
    (-8, 70000, 2**40, 1.5, -2.25, Decimal("1.5"), 0.125, "naïve ☃", True, b"\x00", "2026-12-04",
     "12:34:56.789000", "2026-12-04T01:02:03.456789", None, [1], (7, "seven")),
    with_kind(
        (3, -5, -(2**62), 0.1, math.nan, Decimal("0"), 1.5, "m", False, b"z", "0999-01-02",
         "00:00:00", "2026-12-04T01:02:03", None, [], (1, "")),
        "DELETE",
    ),
    with_kind(tuple(None for _ in TYPES.fields), "UPDATE_AFTER"),
    (0, 70000, 0, -1.0, math.inf, Decimal("-3.25"), -0.0, "", True, b"", "2026-12-05",
     "23:59:59.000001", "1970-01-01T00:00:00", None, None, None),
]  # fmt: skip
VALUES = {
    "t": ["3", "x"],
    "i": ["70000", "-5", " 7 ", "99999999999999999999999", "1.5"],
    "b": ["0", "-4611686018427387904", "-99999999999999999999999"],
    "f": ["1.5", "0.1", "nan", "-inf"],
    "d": ["nan", "inf", "-2.25", "1e400"],
    "dec": ["1.5"],
    "num": ["0", "-0.0", "1.5"],
    "str": ["m", "", "naïve ☃", "n"],
    "flag": ["True"],
    "raw": ["z"],
    "day": ["2026-12-04", "2026-12-04T", "1000"],
    "clock": ["12:34:56.789", "12:34:56.789000", "00:00:00", "23:59:59"],
    "at": ["2026-12-04T01:02:03", "2026-12-04T01:02:03.456789", "2026-12-04 01", "2026"],
    "nothing": ["x"],
    "list": ["[1]"],
    "nested": ["x"],
}
OPS = ["==", "!=", "<", "<=", ">", ">="]
#: The kinds whose comparisons RowFilter makes on whole columns.
COLUMN_KINDS = ("t", "i", "b", "f", "d", "dec", "num", "str", "day", "clock", "at")


def outcome(fn, batch):
    """The rows ``fn`` makes of the batch (kinds included), or the error it raises."""
    try:
        out = to_rows(fn(batch))
    except Exception as exc:  # compared as (type, message): both paths must fail alike
        return type(exc).__name__, str(exc)
    return [(repr(r), row_kind(r)) for r in out]  # repr: nan == nan and 0.0 vs -0.0


def both_paths(plugin: TransformPlugin, schema: Schema):
    """The batch processor, and the row model's (the base class over ``row_processor``)."""
    return plugin.processor(schema), TransformPlugin.processor(plugin, schema)


def row_filter(field: str, op: str, value: str) -> RowFilter:
    return RowFilter({"field": field, "op": op, "value": value}, "transform[0]")


@pytest.mark.parametrize("field", [name for name, _ in TYPES.fields])
def test_row_filter_keeps_what_the_row_path_keeps(field):
    batch = from_rows(ROWS, TYPES)
    for value in VALUES[field]:
        for op in OPS:
            batch_path, row_path = both_paths(row_filter(field, op, value), TYPES)
            expected = outcome(row_path, batch)
            assert outcome(batch_path, batch) == expected, (field, op, value)
            for part in (batch.slice(0, 1), batch.slice(2, 1), batch.slice(0, 0)):
                assert outcome(batch_path, part) == outcome(row_path, part), (field, op, value)


@pytest.mark.parametrize("field", COLUMN_KINDS)
def test_row_filter_compares_numbers_strings_and_times_on_whole_columns(field):
    batch = from_rows(ROWS, TYPES)
    kind = dict(TYPES.fields)[field]
    column = batch.column(TYPES.index(field))
    convert = row_filter(field, "<=", VALUES[field][0]).comparison(TYPES)[3]
    value = convert(VALUES[field][0])
    assert _column_compare(column, kind, "<=", value) is not None


@pytest.mark.parametrize(
    "field,value,kept", [("t", "3", [3]), ("dec", "1.5", [-8]), ("dec", "1.50000", [-8])]
)
def test_row_filter_compares_small_integers_and_decimals_as_numbers(field, value, kept):
    batch = from_rows(ROWS, TYPES)
    for path in both_paths(row_filter(field, "==", value), TYPES):
        assert [row[0] for row in to_rows(path(batch))] == kept


def test_row_filter_fails_on_a_value_that_does_not_convert_and_keeps_row_kinds():
    schema = Schema((("id", "bigint"), ("name", "string")))
    batch = from_rows([(1, "a"), with_kind((2, "b"), "DELETE"), (3, None)], schema)
    with pytest.raises(ValueError, match="invalid literal for int"):
        row_filter("id", ">", "not-a-number").processor(schema)(batch)
    kept = row_filter("id", ">=", "2").processor(schema)(batch)
    assert kept.schema.names == ["id", "name", ROW_KIND]
    assert [(r, row_kind(r)) for r in to_rows(kept)] == [
        ((2, "b"), "DELETE"),
        ((3, None), "INSERT"),
    ]
    assert to_rows(row_filter("name", "!=", "a").processor(schema)(batch)) == [(2, "b")]


def replace(pattern: str, replacement: str, regex: bool, first: bool = False) -> Replace:
    config = {
        "replace_field": "s",
        "pattern": pattern,
        "replacement": replacement,
        "is_regex": regex,
        "replace_first": first,
    }
    assert Replace.check(config) == []
    return Replace(config, "transform[0]")


TEXT = Schema((("id", "int"), ("s", "string")))
STRINGS = [
    "a-b-c a-b",
    "",
    None,
    "naïve ☃ naïve",
    "line\nnext\n",
    "x1 y22 z333",
    "٣ digits ٤5",
    "tab\tfs\x1cnbsp\u00a0end",
    "aaaa",
    "ab_cd ef-gh",
    "😀a😀",
]
#: (pattern, replacement): regular expressions RE2 runs, and ones Python keeps.
REGEXES = [
    ("([a-z]+)-", "$1="),
    ("a", "bb"),
    ("[a-c]+", "<$0>"),
    ("^a", "A"),
    (r"\Aa|c\Z", "#"),
    (r"\d+", "#"),
    (r"\D", "."),
    (r"\w+", "[$0]"),
    (r"\W", ""),
    (r"\s", "_"),
    (r"\S+", "w"),
    (r"[^\s]", "."),
    (r"[^\S]", "."),
    (r"\bab", "AB"),
    (r"\Bb", "B"),
    (r"(a)(a)?", "$2$1|"),
    ("(?P<x>a)b", r"\g<x>\\$1\n"),
    (r"a{2,3}?", "2"),
    (r"(?:ab|a)+", "-"),
    ("(a|ab)(c|bcd)?", "$1+$2"),
    (r"(a|b)+", "$1"),  # a repeated group: Python answers
    ("ï|☃|😀", "?"),
    (".", "."),
    ("[é-ü]", "E"),
    ("a$", "$"),  # $ before a last newline: Python answers
    (r"x*", "-"),  # an empty match: Python answers
    ("(?i)A", "i"),  # a flag: Python answers
    (r"(a)\1", "d"),  # a back reference: Python answers
    (r"(?<=a)b", "B"),  # a look-behind: Python answers
    (r"[a\S]", "."),  # \S in a class: Python answers
]
LITERALS = [("a", "bb"), ("-", ""), (" ", "_"), ("ï", "i"), ("aa", "a"), ("", "X"), ("\\", "$1")]


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("regex,pattern,replacement", [
    *[(True, p, r) for p, r in REGEXES],
    *[(False, p, r) for p, r in LITERALS],
])  # fmt: skip
def test_replace_replaces_what_the_row_path_replaces(regex, pattern, replacement, first):
    rows = [with_kind((n, s), "DELETE") if n % 3 == 1 else (n, s) for n, s in enumerate(STRINGS)]
    batch = from_rows(rows, TEXT)
    batch_path, row_path = both_paths(replace(pattern, replacement, regex, first), TEXT)
    assert outcome(batch_path, batch) == outcome(row_path, batch)
    ascii_only = batch.filter(pa.array([s is None or s.isascii() for s in STRINGS]))
    assert outcome(batch_path, ascii_only) == outcome(row_path, ascii_only)
    out = batch_path(batch)
    assert out.schema == batch.schema and kinds(out).equals(kinds(batch))


def test_replace_uses_arrow_for_what_re2_matches_alike():
    assert replace("([a-z]+)-", "$1=", True).column_replacer() is not None
    assert replace(r"\d+", "#", True).column_replacer() is not None
    assert re2_pattern(r"\d+").ascii_only and not re2_pattern("[0-9]+").ascii_only
    assert replace("a", "b", False).column_replacer() is not None
    for pattern, replacement in [("a$", "$"), ("x*", "-"), (r"(a|b)+", "$1"), ("(a)\\1", "")]:
        assert replace(pattern, replacement, True).column_replacer() is None
    assert replace("(a|b)+", "-", True).column_replacer() is not None  # no group referenced
    assert replace("", "X", False).column_replacer() is None


PATTERNS = [p for p, _ in REGEXES] + [r"[ab]+\d", r"(ab?)+?c", r"\s+\w", r"[^ab-]{1,2}"]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.none() | st.text(alphabet="ab1 -_\n\x1cé٣c", max_size=12), max_size=8),
    pattern=st.sampled_from(PATTERNS),
    first=st.booleans(),
)
def test_replace_matches_python_on_any_text(values, pattern, first):
    batch = from_rows([(n, v) for n, v in enumerate(values)], TEXT)
    batch_path, row_path = both_paths(replace(pattern, "<$0>", True, first), TEXT)
    assert outcome(batch_path, batch) == outcome(row_path, batch)
