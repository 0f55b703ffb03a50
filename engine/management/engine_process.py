"""What the master and worker commands share before they run."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from django.conf import settings

from engine.dbsession import configure_engine_sessions
from engine.services import require_services

T = TypeVar("T")


def start_engine_process(options_class: type[T], opts: dict[str, Any]) -> T:
    """Check PostgreSQL and Redis (one line and exit 2 if one is down), set the engine's session
    settings on every database connection, and return the process's options: the fields of
    ``options_class`` taken from the command line."""
    # DEBUG is for the web process's error pages; in an engine process it only keeps every
    # query of every task group's connection in memory (Celery warns of the same leak), a
    # cost on each of the hot path's statements.
    settings.DEBUG = False
    require_services(postgres=True, redis=True)
    configure_engine_sessions()
    names = {f.name for f in dataclasses.fields(options_class)}
    return options_class(**{k: v for k, v in opts.items() if k in names})
