"""Which kind of process this is, decided before Django is set up.

Masters and workers never serve HTTP: they load only the apps the engine uses (no daphne,
twisted, channels, admin, REST framework or login throttling), which makes them start faster
and keeps the web stack out of the processes that run jobs. Every other command (``web``,
``check``, ``migrate``, ``makemigrations``, the tests) keeps the full set.
"""

from __future__ import annotations

from collections.abc import Sequence

FULL = "full"
ENGINE = "engine"

#: The ``manage.py`` commands that run as engine processes.
ENGINE_COMMANDS = frozenset({"master", "worker"})

#: The role of this interpreter: set by ``manage.py`` (or a fork server) before Django reads
#: its settings, and read by ``keel.settings``.
role = FULL


def role_for(argv: Sequence[str]) -> str:
    """The role of ``manage.py`` run with ``argv`` (``argv[0]`` is the script)."""
    return ENGINE if len(argv) > 1 and argv[1] in ENGINE_COMMANDS else FULL
