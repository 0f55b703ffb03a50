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


#: A secret inside a URL: a parameter (``?password=...``, ``&sslpassword=...``, as pgJDBC and
#: Connector/J take them) or the userinfo's password (``//user:secret@host``).
_URL_SECRETS = (
    re.compile(r"(?i)([?&;](?:[\w-]*(?:password|passwd|secret|token))=)([^&;\s\"',}#]*)"),
    # Up to the last '@' before the host (a password may hold '/', '?' or '@' unencoded).
    re.compile(r"(//[^/:@\s\"']+:)([^\s\"']*)(@[^@/\s\"']*(?:[/?\s\"']|$))"),
)


def redact_config(text: str) -> str:
    """The config with every literal secret value replaced (substitutions kept: they name a
    variable, not its value), URLs' passwords included."""
    for pattern in _URL_SECRETS:
        text = pattern.sub(
            lambda m: (
                m.group(0)
                if m.group(2).startswith("${")
                else m.group(1) + REDACTED + (m.group(3) if m.lastindex == 3 else "")
            ),
            text,
        )

    def replace(match: re.Match) -> str:
        value = match.group(2)
        if value.startswith("${"):
            return match.group(0)
        return f'{match.group(1)}"{REDACTED}"'

    return _SECRET_ASSIGNMENT.sub(replace, text)
