"""Secrets in job configs: a literal secret value never leaves the plan."""

from __future__ import annotations

import re

#: An option whose value is a secret: its literal value never leaves the plan (API answers,
#: the dashboard and the stored config text show it redacted).
SECRET_KEY_NAMES = ("password", "passwd", "secret", "token", "credential")
REDACTED = "******"
_SECRET_ASSIGNMENT = re.compile(
    r"""(?ix)
    ((?:^|[\s{,\[])                       # where a key starts
     "?(?:[\w-]+\.)*(?:[\w-]*(?:password|passwd|secret|token|credential)[\w-]*)"?
     \s*[=:]\s*)
    ("(?:[^"\\\n]|\\.)*"|[^\s,}\]#\n]+)  # the literal value: quoted, or unquoted up to a delimiter
    """
)


def redact_config(text: str) -> str:
    """The config with every literal secret value replaced (substitutions kept: they name a
    variable, not its value)."""

    def replace(match: re.Match) -> str:
        value = match.group(2)
        if value.startswith("${"):
            return match.group(0)
        return f'{match.group(1)}"{REDACTED}"'

    return _SECRET_ASSIGNMENT.sub(replace, text)
