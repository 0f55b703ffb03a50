"""The sinks of reader indexes a rescale removed (engine.jobs.rescale_step), settled by the new
reader that adopted them before it reads: opened once under the old index, as a restore of that
reader would open them, which commits that index's share of the checkpoint restored from (and
nothing twice: a sink's commit of a checkpoint is idempotent) and drops what it staged after
it; then closed without writing. Done again by a later attempt of the same reader, it finds
nothing left to commit."""

from __future__ import annotations

import logging

from engine.connectors.base import SinkWriter
from engine.member.dataplane import compile_chain, guarded

log = logging.getLogger("keel.sourceruntime")


def settle_adopted(plan: dict, context: dict, indexes: list[int]) -> None:
    """Open and close the sinks of each old reader index in ``indexes`` under this reader's
    attempt and restored checkpoint (``context``: its own sinks' context)."""
    for index in indexes:
        _, chain = compile_chain(plan, {**context, "readerIndex": index})
        _abort_all(chain.sinks)
        log.info(
            "reader %s settled the sinks of removed reader %s at checkpoint %s",
            context.get("readerIndex"),
            index,
            context.get("restoredCheckpoint"),
        )


def _abort_all(sinks: list[tuple[str, str, SinkWriter]]) -> None:
    """Abort every writer, each whatever the ones before it raised (no session left open);
    a failure is raised once all were tried (a later one with the earlier as its context)."""
    if not sinks:
        return
    (path, _, writer), *rest = sinks
    try:
        guarded(path, writer.abort)
    finally:
        _abort_all(rest)
