"""Sinks' save modes (SeaTunnel's ``schema_save_mode`` and ``data_save_mode``): applied once per
job, before its first row, never again (docs/decisions/0034-save-modes.md).

Where: in the enumerator task group, at its start, before it assigns a split; readers read
nothing before they have one, so no row of the job exists yet. Who: the enumerator of the job's
first pipeline applies the save modes of every sink of the job (several pipelines may write one
directory, and one must not drop what another already wrote); the other pipelines' enumerators
wait for it. The record: ``Job.save_modes_applied_at``, set after the effects, under the
enumerator's attempt fence. A kill -9 before it is set leaves it null, and the next attempt
applies them again, which is safe: each effect is idempotent while no row is written. Once it
is set, a restored attempt, a restore from no checkpoint (which assigns splits again) and a
second reader all find it set and apply nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from django.db import transaction
from django.db.models.functions import Now

from engine.connectors.schema import Schema
from engine.jobs import lifecycle
from engine.member.dataplane import PluginFailure, instantiate
from engine.models import Job, Pipeline, TaskGroup

log = logging.getLogger("keel.savemodes")
#: How often an enumerator of a later pipeline looks whether the first applied them.
WAIT_INTERVAL = 0.05


class EnumeratorThread(Protocol):
    """What the gate needs of the enumerator's thread (engine.member.runtime)."""

    task_group_id: int
    attempt: int
    stop: threading.Event

    @property
    def member_id(self) -> int: ...

    def db(self, what: str, call, *args, **kwargs): ...

    def still_current(self) -> bool: ...


def due_sinks(plans: list[dict]) -> list:
    """The sink plugins of ``plans`` (pipeline plans) that have save modes to apply, each
    told the schema it receives (``input_schema``: a table made from it needs it)."""
    sinks = []
    for plan in plans:
        schemas = {n["key"]: n.get("schema") for n in (plan["source"], *plan["transforms"])}
        for node in plan["sinks"]:
            sink = instantiate(node)
            if schemas.get(node["input"]):
                sink.input_schema = Schema.from_json(schemas[node["input"]])
            sinks.append(sink)
    return [s for s in sinks if getattr(s, "save_modes_due", lambda: False)()]


def _state(job_id: int) -> tuple[bool, list[tuple[int, dict]]]:
    applied = Job.objects.filter(id=job_id, save_modes_applied_at__isnull=False).exists()
    plans = list(
        Pipeline.objects.filter(job_id=job_id).order_by("index").values_list("index", "plan")
    )
    return applied, plans


def before_first_split(thread: EnumeratorThread, group: TaskGroup) -> bool:
    """Apply the job's save modes if they are due and not applied yet (the first pipeline's
    enumerator), or wait until they are (the others). False if the attempt stopped or is no
    longer current; PluginFailure names the sink whose save mode failed (a directory that must
    exist and does not, or must be empty and is not)."""
    applied, plans = thread.db("reading its job's save modes", _state, group.job_id)
    if applied:
        return True
    sinks = due_sinks([plan for _, plan in plans])
    if not sinks:
        return True
    if group.pipeline.index != plans[0][0]:
        return _wait(thread, group.job_id)

    def owned() -> bool:
        return lifecycle.owns(thread.task_group_id, thread.attempt, thread.member_id)

    for sink in sinks:
        # Before each effect: an attempt frozen since the last check and woken after a newer
        # one applied them and wrote rows must not drop them.
        if not thread.db("checking its attempt", owned):
            return False
        try:
            done = sink.apply_save_modes()
        except Exception as exc:
            raise PluginFailure(sink.path, exc) from exc
        for what in done:
            log.info("job %s: %s: %s", group.job_id, sink.path, what)
    return thread.db("recording its save modes", _record, group.job_id, owned)


def _record(job_id: int, owned) -> bool:
    with transaction.atomic():
        if not owned():
            return False
        Job.objects.filter(id=job_id, save_modes_applied_at__isnull=True).update(
            save_modes_applied_at=Now()
        )
    return True


def before_first_row(thread: EnumeratorThread, group: TaskGroup) -> bool:
    """A Lane A reader opens its sinks' writers at once, before it has a split: it waits until
    the job's save modes are applied (a table they create must exist when a writer opens).
    False if the attempt stopped or is no longer current."""
    applied, plans = thread.db("reading its job's save modes", _state, group.job_id)
    if applied or not due_sinks([plan for _, plan in plans]):
        return True
    return _wait(thread, group.job_id)


def _wait(thread: EnumeratorThread, job_id: int) -> bool:
    """Until the first pipeline's enumerator applied them (False if this attempt stops)."""
    applied = Job.objects.filter(id=job_id, save_modes_applied_at__isnull=False).exists
    turns = 0
    while not thread.db("waiting for its job's save modes", applied):
        turns += 1
        if thread.stop.wait(WAIT_INTERVAL) or (turns % 20 == 0 and not thread.still_current()):
            return False
    return True
