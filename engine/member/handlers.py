"""Celery tasks. Handlers only validate and hand work to the member runtime; they own no state."""

from __future__ import annotations

from celery import shared_task

from engine.member.worker import current_member


@shared_task(name="engine.member.ping", acks_late=False)
def member_ping(expected_name: str | None = None) -> dict:
    """Answer with the identity of the member that consumed the command (a liveness probe)."""
    member = current_member()
    if member is None:
        return {"ok": False, "error": "not a member process"}
    return {
        "ok": expected_name is None or expected_name == member.name,
        "memberUuid": str(member.uuid),
        "name": member.name,
    }


@shared_task(name="engine.taskgroup.deploy", acks_late=False)
def deploy_task_group(task_group_id: int, attempt: int, member_uuid: str) -> dict:
    """Deploy one attempt of a task group here. Validates, then hands it to the runtime."""
    from engine.member.runtime import current
    from engine.models import TaskGroup
    from engine.states import ExecutionStatus

    member, runtime = current_member(), current()
    if member is None or runtime is None or str(member.uuid) != member_uuid:
        return {"ok": False, "reason": "command for another member"}
    group = (
        TaskGroup.objects.filter(id=task_group_id).values("attempt", "member_id", "status").first()
    )
    if group is None:
        return {"ok": False, "reason": "unknown task group"}
    if group["attempt"] != attempt or group["member_id"] != member.id:
        return {"ok": False, "reason": "stale attempt"}
    if group["status"] != ExecutionStatus.DEPLOYING:
        return {"ok": False, "reason": f"task group is {group['status']}"}
    return {"ok": True, "result": runtime.deploy(task_group_id, attempt)}


@shared_task(name="engine.taskgroup.cancel", acks_late=False)
def cancel_task_group(task_group_id: int, attempt: int, member_uuid: str) -> dict:
    from engine.member.runtime import current

    member, runtime = current_member(), current()
    if member is None or runtime is None or str(member.uuid) != member_uuid:
        return {"ok": False, "reason": "command for another member"}
    return {"ok": True, "result": runtime.cancel(task_group_id, attempt)}


@shared_task(name="engine.control.run", acks_late=True)
def run_control_step(step_id: int, epoch: int) -> str:
    """A durable control step (backed by its ControlStep row; idempotent by its key)."""
    from engine.jobs.recovery import run_step

    return run_step(step_id, epoch)


def _runtime_for(member_uuid: str):
    from engine.member.runtime import current

    member, runtime = current_member(), current()
    if member is None or runtime is None or str(member.uuid) != member_uuid:
        return None
    return runtime


@shared_task(name="engine.checkpoint.barrier", acks_late=False)
def checkpoint_barrier(
    task_group_id: int, attempt: int, member_uuid: str, checkpoint_id: int
) -> dict:
    """Hand barrier N to the task group's mailbox; it is handled between two batches."""
    runtime = _runtime_for(member_uuid)
    if runtime is None:
        return {"ok": False, "reason": "command for another member"}
    return {"ok": runtime.offer(task_group_id, attempt, ("barrier", checkpoint_id))}


@shared_task(name="engine.checkpoint.commit", acks_late=False)
def checkpoint_commit(
    task_group_id: int, attempt: int, member_uuid: str, checkpoint_id: int
) -> dict:
    runtime = _runtime_for(member_uuid)
    if runtime is None:
        return {"ok": False, "reason": "command for another member"}
    return {"ok": runtime.offer(task_group_id, attempt, ("commit", checkpoint_id))}
