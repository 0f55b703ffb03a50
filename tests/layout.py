"""The layout's size rules, checked by ``./run lint`` and tests/test_architecture.py:

- no module over MAX_LINES lines, except generated migrations;
- no repeated block outside migrations and tests: a run of six or more lines that stands twice,
  either the same lines or the same shape with other names, strings and numbers.

A line's shape is its tokens with every name, string and number abstracted (keywords and
operators kept); blank lines, comments and import statements do not count, and the lines inside
a multi-line string count by their text. A run that stands in more than eight places is an idiom
of the language or framework, not a copy, and is left out, as is a run of little substance
(mostly brackets, or the items of a list).
"""

from __future__ import annotations

import io
import keyword
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The code the rules cover (tests and migrations apart).
SOURCES = ("engine", "keel", "dashboard", "history", "devcluster", "bench")
MAX_LINES = 500
#: f-strings are one STRING token up to Python 3.11, three kinds of token after.
_STRING_START = {tokenize.STRING, getattr(tokenize, "FSTRING_START", tokenize.STRING)}
_STRING_REST = {
    getattr(tokenize, n) for n in ("FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)
}

RUN = 6
TOO_COMMON = 8
#: A run counts only if this many of its lines have some substance (at least SUBSTANCE tokens,
#: not a lone item): six closing brackets, or six items of a list, are not a copy of anything.
SUBSTANTIAL_LINES = 4
SUBSTANCE = 4


@dataclass(frozen=True)
class Place:
    path: str
    first: int  # line numbers, 1-based, inclusive
    last: int

    def __str__(self) -> str:
        return f"{self.path}:{self.first}-{self.last}"


def line_shapes(source: str) -> list[tuple[int, str]]:
    """(line number, shape) of every line that counts, in order."""
    shapes: dict[int, list[str]] = defaultdict(list)
    literal: dict[int, str] = {}
    lines = source.splitlines()
    imports: set[int] = set()  # the lines of import statements: dependencies, not code
    statement: list[int] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        statement.append(token.start[0])
        if token.type == tokenize.NEWLINE:
            first = statement[0]
            if lines[first - 1].lstrip().startswith(("import ", "from ")):
                imports.update(range(first, token.start[0] + 1))
            statement = []
        elif token.type in (tokenize.NL, tokenize.COMMENT) and len(statement) == 1:
            statement = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        kind, text, (row, _), (end_row, _) = token.type, token.string, token.start, token.end
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            continue
        if kind in (tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING):
            continue
        if kind == tokenize.NAME:
            shapes[row].append(text if keyword.iskeyword(text) else "N")
        elif kind == tokenize.NUMBER:
            shapes[row].append("0")
        elif kind in _STRING_START:
            shapes[row].append("S")
            for inner in range(row + 1, end_row + 1):  # a multi-line string counts its text
                literal[inner] = lines[inner - 1].strip()
        elif kind in _STRING_REST:
            continue
        else:
            shapes[row].append(text)
    out = {row: " ".join(parts) for row, parts in shapes.items() if row not in imports}
    for row, text in literal.items():
        if text and row not in out:
            out[row] = "«" + text
    return sorted(out.items())


def substantial(shape: str) -> bool:
    """Not text, not a lone item of a literal or an argument list (``key=value,``)."""
    parts = shape.split()
    item = parts[-1:] == [","] and "(" not in parts
    return not shape.startswith("«") and not item and len(parts) >= SUBSTANCE


def repeated_runs(root: Path, paths: list[Path]) -> list[tuple[Place, Place]]:
    """Pairs of places sharing a run of RUN or more lines of the same shape, the first run of
    each pair of files; runs of little substance are left out."""
    where: dict[tuple[str, ...], list[tuple[str, list[int], int]]] = defaultdict(list)
    files: dict[str, list[tuple[int, str]]] = {}
    for path in paths:
        name = str(path.relative_to(root))
        files[name] = shapes = line_shapes(path.read_text(encoding="utf-8"))
        rows = [row for row, _ in shapes]
        for i in range(len(shapes) - RUN + 1):
            window = tuple(shape for _, shape in shapes[i : i + RUN])
            if sum(substantial(s) for s in window) < SUBSTANTIAL_LINES:
                continue
            where[window].append((name, rows, i))
    pairs: dict[tuple[str, str], tuple[Place, Place]] = {}
    for places in where.values():
        if len(places) < 2 or len(places) > TOO_COMMON:
            continue
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (file_a, rows_a, i), (file_b, rows_b, j) = places[a], places[b]
                if file_a == file_b and abs(i - j) < RUN:
                    continue  # a run overlapping itself (a long run of one shape)
                key = (file_a, file_b)
                first = Place(file_a, rows_a[i], rows_a[i + RUN - 1])
                second = Place(file_b, rows_b[j], rows_b[j + RUN - 1])
                pairs.setdefault(key, (first, second))
    return sorted(pairs.values(), key=lambda pair: (str(pair[0]), str(pair[1])))


def modules(*, tests: bool) -> list[Path]:
    """The project's Python modules, migrations excepted (and tests unless asked for)."""
    roots = [*SOURCES, "tests"] if tests else SOURCES
    return [
        path
        for root in roots
        for path in sorted((ROOT / root).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def oversized() -> list[tuple[str, int]]:
    """Modules over MAX_LINES lines: (path, lines)."""
    out = []
    for path in modules(tests=True):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append((str(path.relative_to(ROOT)), lines))
    return out


def main() -> int:
    problems = [f"{path}: {lines} lines (at most {MAX_LINES})" for path, lines in oversized()]
    problems += [
        f"{a} ~ {b}: the same {RUN}+ lines" for a, b in repeated_runs(ROOT, modules(tests=False))
    ]
    print("\n".join(problems) or "layout: no oversized module, no repeated block")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
