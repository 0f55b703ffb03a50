"""The partition relay cuts a link right after a given statement, so its reading of the
client's PostgreSQL stream must find every statement's text (simple Query or Parse) and
nothing else, wherever TCP happens to split the bytes."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given
from hypothesis import strategies as st

from tests.linkrelay import SSL_REQUEST, Statements

PROTOCOL_3 = 196608


def untyped(body: bytes) -> bytes:
    return struct.pack("!i", 4 + len(body)) + body


def typed(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", 4 + len(body)) + body


#: What a client sends: an SSL request, its startup message, a simple COMMIT, then the
#: extended protocol (Parse of a named statement, Bind, Sync).
STREAM = b"".join(
    [
        untyped(struct.pack("!i", SSL_REQUEST)),
        untyped(struct.pack("!i", PROTOCOL_3) + b"user\0postgres\0\0"),
        typed(b"Q", b"COMMIT\0"),
        typed(b"P", b"s1\0COMMIT PREPARED 'x'\0" + struct.pack("!h", 0)),
        typed(b"B", b"\0s1\0" + struct.pack("!hhh", 0, 0, 0)),
        typed(b"S", b""),
    ]
)
EXPECTED = ["COMMIT", "COMMIT PREPARED 'x'"]


def read_in_pieces(cuts: list[int]) -> list[str]:
    statements = Statements()
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    found: list[str] = []
    for start, end in itertools.pairwise(bounds):
        found += statements.feed(STREAM[start:end])
    return found


def test_the_ssl_request_is_exactly_eight_bytes():
    """The reading depends on the fixture's framing being the protocol's."""
    assert untyped(struct.pack("!i", SSL_REQUEST)) == struct.pack("!ii", 8, 80877103)


def test_whole_and_byte_by_byte():
    assert read_in_pieces([]) == EXPECTED
    assert read_in_pieces(list(range(1, len(STREAM)))) == EXPECTED


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_split_finds_the_same_statements(cuts):
    assert read_in_pieces(cuts) == EXPECTED


def test_a_message_after_the_statements_is_read_past():
    """A statement after skipped messages still lines up: the framing stays in step."""
    statements = Statements()
    assert statements.feed(STREAM) == EXPECTED
    assert statements.feed(typed(b"Q", b"ROLLBACK\0")) == ["ROLLBACK"]
