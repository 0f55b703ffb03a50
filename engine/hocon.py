"""HOCON for untrusted job configs: pyhocon, with the environment and the file system out of reach.

pyhocon resolves a ``${NAME}`` it cannot find in the config from ``os.environ`` (so a config could
read the process's secrets) and honours ``include file(...)``, globs and ``include url(...)``.
Here, on import, its module gets a view of ``os`` whose environment is the variables passed with
the submission (SeaTunnel's ``-i key=value``), nothing else, and include loading that always
refuses. ``scan`` checks a config's size, nesting and includes before pyhocon sees it, so these
are refused with the line they are on and pyhocon's recursion is bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import types
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType

import pyhocon.config_parser as _pyhocon
from pyhocon.exceptions import ConfigException

_variables: ContextVar[Mapping[str, str]] = ContextVar(
    "keel_hocon_variables", default=MappingProxyType({})
)

#: Variable names (``-i NAME=value``): what a HOCON substitution may name.
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$")
_INCLUDE = re.compile(r"include\b", re.IGNORECASE)
_INCLUDE_TARGET = re.compile(r"[ \t]*(\"|(url|file|package|classpath|required)[ \t]*\()")


class IncludeRefused(ConfigException):
    """Raised by pyhocon's include loading: job configs include nothing."""


class _SandboxedOs(types.ModuleType):
    """``os`` as pyhocon sees it: everything but the environment, which is the variables of the
    config being parsed (none outside ``variables(...)``)."""

    def __getattr__(self, name: str):
        return getattr(os, name)

    @property
    def environ(self) -> Mapping[str, str]:
        return _variables.get()


class _NoIncludes:
    """pyhocon's ``ConfigFactory`` as its include handler sees it."""

    @staticmethod
    def _refuse(*args, **kwargs):
        raise IncludeRefused("include is not allowed in a job config")

    parse_file = parse_URL = _refuse


def _install() -> None:
    if not isinstance(_pyhocon.os, _SandboxedOs):
        _pyhocon.os = _SandboxedOs("os")
    _pyhocon.ConfigFactory = _NoIncludes  # the name its include handler looks up
    _pyhocon.glob = _NoIncludes._refuse
    _pyhocon.urlopen = _NoIncludes._refuse


_install()


@contextlib.contextmanager
def variables(values: Mapping[str, str] | None) -> Iterator[None]:
    """Substitutions not found in the config resolve from ``values`` while parsing."""
    token = _variables.set(MappingProxyType(dict(values or {})))
    try:
        yield
    finally:
        _variables.reset(token)


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_depth: int


@dataclass(frozen=True)
class Refusal:
    message: str
    line: int | None = None
    column: int | None = None


def scan(text: str, limits: Limits) -> Refusal | None:
    """One pass over the config (quoted strings skipped): its size, its nesting depth and any
    ``include``. Comments are not skipped: an include in one is refused too (pyhocon's idea of
    where a comment starts differs from a simple scanner's, and a refusal is the safe side)."""
    size = len(text.encode("utf-8"))
    if size > limits.max_bytes:
        return Refusal(
            f"the config is {size} bytes, over the limit of {limits.max_bytes} "
            "(engine.config.max-bytes)"
        )
    depth = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i = skip_string(text, i)
            continue
        if ch in "{[":
            depth += 1
            if depth > limits.max_depth:
                line, column = position(text, i)
                return Refusal(
                    f"the config nests deeper than {limits.max_depth} levels "
                    "(engine.config.max-depth)",
                    line,
                    column,
                )
        elif ch in "}]":
            depth = max(depth - 1, 0)
        elif ch in "iI" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            match = _INCLUDE.match(text, i)
            if match and _INCLUDE_TARGET.match(text, match.end()):
                line, column = position(text, i)
                return Refusal(
                    "include is not allowed in a job config: write the values in it, or pass "
                    "them as variables with the submission",
                    line,
                    column,
                )
        i += 1
    return None


def skip_string(text: str, i: int) -> int:
    """Index just past the string starting at text[i] (a quote; triple quotes too)."""
    if text.startswith('"""', i):
        end = text.find('"""', i + 3)
        return len(text) if end < 0 else end + 3
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] in '"\n':
            return j + 1
        j += 1
    return j


def position(text: str, index: int) -> tuple[int, int]:
    """(line, column), both from 1."""
    line = text.count("\n", 0, index) + 1
    start = text.rfind("\n", 0, index) + 1
    return line, index - start + 1


def describe_at(text: str, index: int) -> str:
    """A short human description of what stands at ``index`` (for a syntax error)."""
    if index >= len(text.rstrip()):
        return "end of the config (a brace, bracket or string left open?)"
    rest = text[index:].split("\n", 1)[0].strip()
    if not rest:
        return "a line break"
    token = rest[:24] + ("…" if len(rest) > 24 else "")
    return f"'{token}'"


#: SeaTunnel's table placeholders: a sink fills them per table, so no variable may name them.
TABLE_PLACEHOLDERS = frozenset(
    {
        "database_name",
        "schema_name",
        "schema_full_name",
        "table_name",
        "table_full_name",
        "primary_key",
        "unique_key",
        "field_names",
    }
)
_PLACEHOLDER = re.compile(r"\$\{(\?)?\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(?::([^}]*))?\}")


def fill_strings(value: object, values: Mapping[str, str]) -> object:
    """``value`` (a parsed config) with ``${name}`` in its strings replaced as SeaTunnel does
    for ``-i`` variables: in quoted strings too, which HOCON leaves alone. A name given in
    ``values`` takes its value; else ``${name:default}`` takes the default and ``${?name}``
    nothing; else the text stays as written (``${now}`` of a file name, a table placeholder)."""
    if isinstance(value, dict):
        return {k: fill_strings(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_strings(v, values) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def replace(match: re.Match) -> str:
        optional, name, default = match.groups()
        if name in TABLE_PLACEHOLDERS:
            return match.group(0)
        if name in values:
            return values[name]
        if default is not None:
            return default
        return "" if optional else match.group(0)

    return _PLACEHOLDER.sub(replace, value)
