"""Which kind of process this is, decided before Django is set up.

Masters and workers never serve HTTP: they load only the apps the engine uses (no daphne,
twisted, channels, admin, REST framework or login throttling), which makes them start faster
and keeps the web stack out of the processes that run jobs. ``./run cluster start`` and the
other cluster actions that only watch and restart processes add their own app to that set.
Every other command (``web``, ``check``, ``migrate``, ``makemigrations``, ``cluster up``, the
tests) keeps the full set.
"""

from __future__ import annotations

from collections.abc import Sequence

FULL = "full"
ENGINE = "engine"
#: ``manage.py cluster`` watching or restarting local processes: the engine's apps and the
#: command's own (devcluster).
CLUSTER = "cluster"

#: The ``manage.py`` commands that run as engine processes.
ENGINE_COMMANDS = frozenset({"master", "worker"})

#: ``manage.py cluster`` actions that only start, stop and watch processes: no web app is
#: needed (``up`` makes the API's tokens, which needs the REST framework).
ENGINE_CLUSTER_ACTIONS = frozenset({"status", "kill", "stop", "start", "drain", "down"})

#: The role of this interpreter: set by ``manage.py`` (or a fork server) before Django reads
#: its settings, and read by ``keel.settings``.
role = FULL


def role_for(argv: Sequence[str]) -> str:
    """The role of ``manage.py`` run with ``argv`` (``argv[0]`` is the script)."""
    command = argv[1] if len(argv) > 1 else ""
    if command in ENGINE_COMMANDS:
        return ENGINE
    if command == "cluster" and len(argv) > 2 and argv[2] in ENGINE_CLUSTER_ACTIONS:
        return CLUSTER
    return FULL
