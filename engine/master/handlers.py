"""The Celery task of durable control steps: master-side work that any worker's pool runs on the
``control`` queue (acks_late: a worker that dies mid-step leaves the message to another)."""

from __future__ import annotations

from celery import shared_task

from engine.master.control import run_step
from engine.protocol import TASK_CONTROL_STEP


@shared_task(name=TASK_CONTROL_STEP, acks_late=True, ignore_result=True)
def run_control_step(step_id: int, epoch: int) -> str:
    """A durable control step (backed by its ControlStep row; idempotent by its key)."""
    return run_step(step_id, epoch)
