"""The traceback a task group's failure report carries to its job's exception history
(engine.jobs.exceptions): what an operator reads to find why, kept to its end."""

from __future__ import annotations

import traceback

from engine.jobs.exceptions import last_part
from engine.member.dataplane import PluginFailure


def traceback_of(exc: BaseException) -> str:
    """The formatted traceback of ``exc``, its last 16 KB. For a plugin's failure, that of the
    plugin's own error (its cause), not the engine frames that wrapped it."""
    if isinstance(exc, PluginFailure) and exc.__cause__ is not None:
        exc = exc.__cause__
    return last_part("".join(traceback.format_exception(exc)))
