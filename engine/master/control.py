"""Durable control steps: the active master runs due steps itself for a moment each pass, ten
restores to a transaction; a step it has had no time for in a second goes to the control queue,
where any worker's Celery pool runs it, under the epoch it was enqueued with.

The ControlStep row is the intent. A step that is not DONE after engine.control-step.requeue-after
(10 s), or that was enqueued under an older epoch, is enqueued again: a master or worker dying
in the middle of a recovery never leaves the pipeline stuck, and running a step twice changes
nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, InterfaceError
from django.db.models import Q
from django.utils import timezone

from engine.fencing import StaleEpoch, fenced
from engine.jobs import cleanup, recovery
from engine.master import commands
from engine.models import ControlStep
from engine.states import RESTORE_KINDS, ControlStepState

log = logging.getLogger("keel.control")
#: How long one pass of the active master runs due steps itself (a chunk of restores or a few).
INLINE_BUDGET = 0.25
#: Restores one transaction of the master runs (engine.jobs.recovery.restore_pipelines).
STEPS_PER_TRANSACTION = 10
#: A due step the master had no time for in a pass waits for its next pass, unless it has been
#: due this long: then it goes to the control queue, where the workers' pools run it. (The
#: master's restores reached RUNNING 0.25 s after they committed, the pools' 0.9 s, and the
#: pools committed later: under a storm the master is the quicker of the two.)
HAND_OFF_AFTER = 1.0


def requeue_after() -> float:
    """Seconds after which a step enqueued and not DONE is enqueued again."""
    return float(settings.ENGINE["control-step.requeue-after"])


def enqueue_due_steps(epoch: int, on_recovery: Callable[[], object] = lambda: None) -> bool:
    """Active-master step: run due control steps, here for up to INLINE_BUDGET (a restore
    starts at once, with no queue between); of the rest, give back for the next pass those
    due for less than HAND_OFF_AFTER and put the others on the control queue, where every
    worker's pool runs them (under our epoch either way). ``on_recovery`` is called once if a
    step restored here or went to the queue (not for a restore still waiting for slots: no
    recovery moved)."""
    now = timezone.now()
    with fenced(epoch):
        due = list(
            ControlStep.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(state=ControlStepState.PENDING, due_at__lte=now)
            .filter(
                Q(enqueued_at__isnull=True)
                | Q(enqueued_at__lt=now - timedelta(seconds=requeue_after()))
                | ~Q(epoch=epoch)
            )
            .order_by("due_at", "id")[:100]
        )
        if due:
            ControlStep.objects.filter(id__in=[s.id for s in due]).update(
                enqueued_at=now, epoch=epoch
            )
    deadline = time.monotonic() + INLINE_BUDGET
    moved = False
    position = 0
    while position < len(due) and time.monotonic() < deadline:
        chunk = due[position : position + STEPS_PER_TRANSACTION]
        try:
            answers = _run_here(chunk, epoch)
        except BaseException:
            # The master cannot go on (database, epoch): the workers run this chunk and the
            # rest of those claimed, rather than waiting to enqueue them again.
            for rest in due[position:]:
                commands.run_control_step(rest.id, epoch)
            raise
        for step in chunk:
            result = answers.get(step.id)
            if result is None:
                commands.run_control_step(step.id, epoch)
            moved = moved or result not in recovery.WAITING
        position += len(chunk)
    cutoff = now - timedelta(seconds=HAND_OFF_AFTER)
    given_back = [step.id for step in due[position:] if step.due_at > cutoff]
    if given_back:  # claimed by nobody again: the next pass (of whichever master) takes them
        with fenced(epoch):
            ControlStep.objects.filter(id__in=given_back, enqueued_at=now).update(enqueued_at=None)
    for step in due[position:]:
        if step.due_at <= cutoff:
            commands.run_control_step(step.id, epoch)
            moved = True
    if moved:
        on_recovery()
    return bool(due)


def _run_here(steps: list[ControlStep], epoch: int) -> dict[int, str | None]:
    """Run steps in the master's loop, their restores in one transaction: what happened to
    each, None for one that failed or whose job another transaction held (a worker runs it
    instead). A stale epoch or a database error is raised: the master steps down, or
    reconnects."""
    answers: dict[int, str | None] = {
        s.id: f"unknown step kind {s.kind}" for s in steps if s.kind not in RESTORE_KINDS
    }
    restores = [s for s in steps if s.kind in RESTORE_KINDS]
    if not restores:
        return answers
    try:
        results, deployments = recovery.restore_pipelines(restores, epoch, skip_locked=True)
    except (StaleEpoch, DatabaseError, InterfaceError):
        raise
    except Exception:
        log.exception(
            "control steps %s failed in the master; the control queue runs them",
            [s.id for s in restores],
        )
        return answers | dict.fromkeys((s.id for s in restores), None)
    commands.deploy(deployments)
    for step_id, result in results.items():
        answers[step_id] = None if isinstance(result, Exception) else result
    return answers


def run_step(step_id: int, epoch: int) -> str:
    """Execute one control step (in any worker's Celery pool). Returns what happened."""
    step = ControlStep.objects.filter(id=step_id).first()
    if step is None or step.state == ControlStepState.DONE:
        return "done already"
    if step.kind not in RESTORE_KINDS:
        return f"unknown step kind {step.kind}"
    try:
        result, deployments = recovery.restore_pipeline(step, epoch)
    except StaleEpoch:
        return "stale epoch: the active master re-enqueues it"
    commands.deploy(deployments)
    return result


def enqueue_due_cleanups(epoch: int) -> bool:
    """Active-master step: put overdue cleanup records on the control queue (the countdown
    sent when the job ended is only a hint). True while a full batch was due."""
    with fenced(epoch):
        ids = cleanup.claim_due()
    for start in range(0, len(ids), cleanup.MESSAGE_BATCH):
        commands.run_cleanups(ids[start : start + cleanup.MESSAGE_BATCH])
    return len(ids) >= cleanup.SWEEP_BATCH
