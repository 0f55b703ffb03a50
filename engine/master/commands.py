"""Commands from the master side to members and to the control queue, sent by Celery task name.

This is the only module that sends them, and it imports no handler: the names and queues are
the protocol (engine.protocol). Sending only puts the command in the process's outbox, which a
thread of its own publishes: the master loop (lease renewal included) never waits on the broker.
Every command re-states an intent already in PostgreSQL, so the outbox needs no durability of
its own: it is bounded, drops its oldest when full, and whatever is lost is sent again by the
step that sent it (deploy redelivery, cancel resend, barrier resend, control-step re-enqueue).
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.jobs.scheduler import Deployment
from engine.outbox import Outbox
from engine.protocol import (
    CONTROL_QUEUE,
    TASK_ABORT,
    TASK_BARRIER,
    TASK_CANCEL,
    TASK_CLEANUP,
    TASK_COMMIT,
    TASK_CONTROL_STEP,
    TASK_DEPLOY,
    TASK_GRACEFUL_CLOSE,
    member_queue,
)

#: This process's outbox (the master's, or a worker's for the control steps it runs).
outbox = Outbox()


def to_member(task: str, target: Deployment, *extra) -> None:
    """Send ``task`` to the task group attempt ``target`` on its member's queue (in one
    message with the others waiting for it, where the member takes them so)."""
    outbox.put(
        task,
        [target.task_group_id, target.attempt, target.member_uuid, *extra],
        member_queue(target.member_name),
        batch=target.batched,
    )


def deploy(deployments: Iterable[Deployment]) -> None:
    for target in deployments:
        to_member(TASK_DEPLOY, target)


def cancel(target: Deployment) -> None:
    to_member(TASK_CANCEL, target)


def barrier(target: Deployment, checkpoint_id: int) -> None:
    to_member(TASK_BARRIER, target, checkpoint_id)


def commit(target: Deployment, checkpoint_id: int) -> None:
    to_member(TASK_COMMIT, target, checkpoint_id)


def abort(target: Deployment, checkpoint_id: int) -> None:
    to_member(TASK_ABORT, target, checkpoint_id)


def graceful_close(target: Deployment) -> None:
    to_member(TASK_GRACEFUL_CLOSE, target)


def run_control_step(step_id: int, epoch: int) -> None:
    outbox.put(TASK_CONTROL_STEP, [step_id, epoch], CONTROL_QUEUE)


def run_cleanups(record_ids: list[int]) -> None:
    outbox.put(TASK_CLEANUP, [record_ids], CONTROL_QUEUE)
