"""The Celery task of durable control steps: master-side work that any worker's pool runs on the
``control`` queue (acks_late: a worker that dies mid-step leaves the message to another)."""

from __future__ import annotations

from celery import shared_task

from engine.jobs import cleanup
from engine.master.control import run_step
from engine.protocol import TASK_CLEANUP, TASK_CONTROL_STEP


@shared_task(name=TASK_CONTROL_STEP, acks_late=True, ignore_result=True)
def run_control_step(step_id: int, epoch: int) -> str:
    """A durable control step (backed by its ControlStep row; idempotent by its key)."""
    return run_step(step_id, epoch)


@shared_task(name=TASK_CLEANUP, acks_late=True, ignore_result=True)
def run_cleanups(record_ids: list[int]) -> list[str]:
    """Execute due cleanup records, each in its own transaction under its row lock
    (idempotent: a duplicate delivery finds them DONE or held)."""
    return [cleanup.execute(record_id) for record_id in record_ids]
