"""Commands from the master side to members and to the control queue, sent by Celery task name.

This is the only module that sends them, and it imports no handler: the names and queues are
the protocol (engine.protocol). Every command re-states an intent already in PostgreSQL, so a
message that cannot be sent (broker down) is only logged: the step that sent it sends it again
on a later pass (redelivery, cancel resend, checkpoint timeout, control-step re-enqueue).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from celery import current_app

from engine.jobs.scheduler import Deployment
from engine.protocol import (
    CONTROL_QUEUE,
    TASK_BARRIER,
    TASK_CANCEL,
    TASK_COMMIT,
    TASK_CONTROL_STEP,
    TASK_DEPLOY,
    member_queue,
)

log = logging.getLogger("keel.commands")


def _send(task: str, args: list, queue: str) -> bool:
    try:
        current_app.send_task(task, args=args, queue=queue)
        return True
    except Exception:
        log.warning("could not send %s to %s", task, queue, exc_info=True)
        return False


def to_member(task: str, target: Deployment, *extra) -> bool:
    """Send ``task`` to the task group attempt ``target`` on its member's queue."""
    return _send(
        task,
        [target.task_group_id, target.attempt, target.member_uuid, *extra],
        member_queue(target.member_name),
    )


def deploy(deployments: Iterable[Deployment]) -> None:
    for target in deployments:
        to_member(TASK_DEPLOY, target)


def cancel(target: Deployment) -> bool:
    return to_member(TASK_CANCEL, target)


def barrier(target: Deployment, checkpoint_id: int) -> bool:
    return to_member(TASK_BARRIER, target, checkpoint_id)


def commit(target: Deployment, checkpoint_id: int) -> bool:
    return to_member(TASK_COMMIT, target, checkpoint_id)


def run_control_step(step_id: int, epoch: int) -> bool:
    return _send(TASK_CONTROL_STEP, [step_id, epoch], CONTROL_QUEUE)
