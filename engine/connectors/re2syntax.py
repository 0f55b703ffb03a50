"""Python's regular expressions in RE2's syntax, for the Replace transform's batch path.

Arrow's regex kernels run RE2, whose matches agree with Python's (leftmost-first, the same
submatches) on a common subset: literals, classes, groups, alternations and repeats, with no
match that may be empty (the two advance past an empty match differently). Outside it the
transform replaces value by value in Python. ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are
Unicode-aware in Python and ASCII in RE2, so a pattern using them goes to RE2 only for an
all-ASCII column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from re import _constants as sre  # the parsed form of Python's patterns
from re import _parser as sre_parse


@dataclass(frozen=True)
class Re2Pattern:
    """A pattern in RE2's syntax, and what limits where it answers as Python would."""

    text: str
    #: It uses a class that means the same in both only on ASCII text.
    ascii_only: bool
    #: A capturing group repeats: which repetition it captures may differ.
    repeated_groups: bool
    #: It asserts a position (``^``, ``\\b``...): Arrow's first-match-only replacement
    #: matches again inside the text it found, where such an assertion may not hold.
    anchored: bool


class _Untranslatable(Exception):
    """A construct RE2 lacks or may match differently."""


#: What Python's ``\s`` matches in ASCII (``str.isspace``: the file separators too).
_ASCII_SPACE = r"\x{9}-\x{d}\x{1c}-\x{20}"
_CATEGORIES = {
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_WORD: r"\w",
    sre.CATEGORY_NOT_WORD: r"\W",
    sre.CATEGORY_SPACE: _ASCII_SPACE,
}
_ANCHORS = {
    sre.AT_BEGINNING: "^",
    sre.AT_BEGINNING_STRING: r"\A",
    sre.AT_END_STRING: r"\z",
    sre.AT_BOUNDARY: r"\b",
    sre.AT_NON_BOUNDARY: r"\B",
}
#: RE2's largest repeat count.
_RE2_MAX_REPEAT = 1000


def re2_pattern(pattern: str) -> Re2Pattern | None:
    """``pattern`` (Python's syntax) in RE2's, or None where RE2 could match otherwise."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    allowed = sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_VERBOSE
    if parsed.state.flags & ~allowed or parsed.getwidth()[0] == 0:
        return None
    writer = _Re2Writer()
    try:
        text = writer.sequence(parsed, repeated=False)
    except _Untranslatable:
        return None
    return Re2Pattern(text, writer.ascii_only, writer.repeated_groups, writer.anchored)


class _Re2Writer:
    """Writes a parsed Python pattern in RE2's syntax, noting what limits its use."""

    def __init__(self) -> None:
        self.ascii_only = False
        self.repeated_groups = False
        self.anchored = False

    def sequence(self, items, repeated: bool) -> str:
        return "".join(self.item(op, arg, repeated) for op, arg in items)

    def item(self, op, arg, repeated: bool) -> str:
        if op is sre.LITERAL:
            return _re2_char(arg)
        if op is sre.NOT_LITERAL:
            return f"[^{_re2_char(arg)}]"
        if op is sre.ANY:
            return "."  # neither matches a newline without DOTALL (refused)
        if op is sre.IN:
            return self.char_class(arg)
        if op is sre.BRANCH:
            return "(?:" + "|".join(self.sequence(alt, repeated) for alt in arg[1]) + ")"
        if op is sre.SUBPATTERN:
            return self.group(arg, repeated)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            return self.repeat(op, arg)
        if op is sre.AT and arg in _ANCHORS:  # Python's $ also matches before a last newline
            self.ascii_only |= arg in (sre.AT_BOUNDARY, sre.AT_NON_BOUNDARY)
            self.anchored = True
            return _ANCHORS[arg]
        raise _Untranslatable(op)

    def group(self, arg, repeated: bool) -> str:
        group, add_flags, del_flags, inner = arg
        if add_flags or del_flags:
            raise _Untranslatable("inline flags")
        body = self.sequence(inner, repeated)
        if group is None:
            return f"(?:{body})"
        self.repeated_groups |= repeated
        return f"({body})"  # groups are numbered by their opening, in both

    def repeat(self, op, arg) -> str:
        low, high, inner = arg
        if inner.getwidth()[0] == 0:  # an empty iteration: the engines differ on those
            raise _Untranslatable("a repeat that may match empty")
        if low > _RE2_MAX_REPEAT or (high != sre.MAXREPEAT and high > _RE2_MAX_REPEAT):
            raise _Untranslatable("a repeat count beyond RE2's")
        bounds = f"{{{low},}}" if high == sre.MAXREPEAT else f"{{{low},{high}}}"
        lazy = "?" if op is sre.MIN_REPEAT else ""
        return f"(?:{self.sequence(inner, repeated=True)}){bounds}{lazy}"

    def char_class(self, items) -> str:
        negate = bool(items) and items[0][0] is sre.NEGATE
        members = items[1:] if negate else items
        if [op for op, _ in members] == [sre.CATEGORY] and members[0][1] is sre.CATEGORY_NOT_SPACE:
            self.ascii_only = True  # \S alone: RE2 has no class for Python's ASCII spaces
            return f"[{'' if negate else '^'}{_ASCII_SPACE}]"
        parts = []
        for op, arg in members:
            if op is sre.LITERAL:
                parts.append(_re2_char(arg))
            elif op is sre.RANGE:
                parts.append(f"{_re2_char(arg[0])}-{_re2_char(arg[1])}")
            elif op is sre.CATEGORY and arg in _CATEGORIES:
                self.ascii_only = True
                parts.append(_CATEGORIES[arg])
            else:
                raise _Untranslatable(op)
        return f"[{'^' if negate else ''}{''.join(parts)}]"


def _re2_char(code: int) -> str:
    """A character by its code point, which RE2 reads the same in and out of classes."""
    if 0xD800 <= code <= 0xDFFF:
        raise _Untranslatable("a surrogate")
    return f"\\x{{{code:x}}}"


def re2_rewrite(pattern: re.Pattern, replacement: str) -> tuple[str, bool] | None:
    """Python's replacement template (group references, escapes) as RE2's rewrite string, and
    whether it references a group; None for a group RE2 cannot name (above 9)."""
    try:
        groups, literals = sre_parse.parse_template(replacement, pattern)
    except (re.error, IndexError, ValueError, TypeError):
        return None
    parts = [(text or "").replace("\\", "\\\\") for text in literals]
    for position, group in groups:
        if group > 9:
            return None
        parts[position] = f"\\{group}"
    return "".join(parts), any(group > 0 for _, group in groups)
