"""Errors as one line for messages and logs: shared by every layer (it imports nothing)."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The gist of a driver error: ``Connection refused`` rather than three lines of libpq
    (its ``connection to server at ... failed:`` prefix dropped); the error's type when it
    says nothing."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0].rsplit(" failed: ", 1)[-1]
