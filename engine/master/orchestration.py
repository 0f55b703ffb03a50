"""The active master's job orchestration steps: schedule, deliver, cancel, fail lost work.

Each step reads its intent from PostgreSQL (job and task-group states), so a new active master
picks up exactly where a dead one stopped; commands are idempotent and re-sent until the state
they aim at is reached.
"""

from __future__ import annotations

import logging
import time

from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from engine.fencing import fenced
from engine.jobs import lifecycle
from engine.jobs.scheduler import Deployment, schedule_next
from engine.models import TaskGroup
from engine.states import EXECUTION_TERMINAL, ExecutionStatus, JobStatus, MemberState

log = logging.getLogger("keel.orchestration")
REDELIVER_AFTER = 5.0
DEPLOY_TIMEOUT = 60.0
CANCEL_RESEND = 2.0


def send_deploy(deployments: list[Deployment]) -> None:
    """Send deploy commands; a message that cannot be sent is re-sent by ``redeliver``."""
    from engine.member.handlers import deploy_task_group

    for d in deployments:
        send(deploy_task_group, d.task_group_id, d.attempt, d.member_name, d.member_uuid)


def send(
    task, group_id: int, attempt: int, member_name: str, member_uuid: str, extra: list | None = None
) -> bool:
    from keel.celery import member_queue

    try:
        task.apply_async(
            args=[group_id, attempt, member_uuid, *(extra or [])], queue=member_queue(member_name)
        )
        return True
    except Exception:
        log.warning("could not send %s to %s", task.name, member_name, exc_info=True)
        return False


def schedule(epoch: int) -> bool:
    deployments = schedule_next(epoch)
    if not deployments:
        return False
    send_deploy(deployments)
    return True


def redeliver(epoch: int) -> bool:
    """Re-send deploy commands that have not been acted on (lost message, dead master), and
    fail deployments a live member has not taken up within DEPLOY_TIMEOUT (its consumer is
    stuck): a job must never wait on a command for ever."""
    with fenced(epoch):
        stale = list(
            TaskGroup.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .filter(
                status=ExecutionStatus.DEPLOYING,
                member__state=MemberState.ALIVE,
                deployed_at__lt=Now() - _seconds(REDELIVER_AFTER),
            )
            .values_list("id", "attempt", "member__name", "member__uuid", "updated_at")[:200]
        )
        if stale:
            TaskGroup.objects.filter(id__in=[s[0] for s in stale]).update(deployed_at=Now())
    if not stale:
        return False
    from engine.member.handlers import deploy_task_group

    cutoff = timezone.now() - _seconds(DEPLOY_TIMEOUT)
    for group_id, attempt, name, uuid, since in stale:
        if since < cutoff:
            with fenced(epoch):
                lifecycle.finish_task_group(
                    group_id,
                    attempt,
                    None,
                    ExecutionStatus.FAILED,
                    f"member {name} ({uuid}) did not take up the deployment within "
                    f"{DEPLOY_TIMEOUT:.0f}s",
                )
            continue
        send(deploy_task_group, group_id, attempt, name, str(uuid))
    log.info("re-sent %s deploy commands", len(stale))
    return True


def _seconds(value: float):
    from datetime import timedelta

    return timedelta(seconds=value)


def stopping_task_groups():
    """Live task groups to cancel: those of CANCELING / FAILING jobs, and the rest of a FAILING
    pipeline (e.g. one about to restore)."""
    stopping = Q(job__status__in=[JobStatus.CANCELING, JobStatus.FAILING]) | Q(
        pipeline__status=ExecutionStatus.FAILING
    )
    return TaskGroup.objects.filter(stopping, member__state=MemberState.ALIVE).exclude(
        status__in=EXECUTION_TERMINAL
    )


class CancelSender:
    """Sends cancel commands to task groups of CANCELING / FAILING jobs until they end."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], float] = {}

    def step(self, epoch: int) -> bool:
        groups = list(
            stopping_task_groups().values_list("id", "attempt", "member__name", "member__uuid")[
                :500
            ]
        )
        now = time.monotonic()
        due = [g for g in groups if now - self.sent.get((g[0], g[1]), 0) >= CANCEL_RESEND]
        if not due:
            return False
        from engine.member.handlers import cancel_task_group

        for group_id, attempt, name, uuid in due:
            send(cancel_task_group, group_id, attempt, name, str(uuid))
            self.sent[(group_id, attempt)] = now
        live = {(g[0], g[1]) for g in groups}
        self.sent = {k: v for k, v in self.sent.items() if k in live}
        return True


def fail_lost_task_groups(epoch: int) -> bool:
    """Task groups whose member is gone can never report: fail them as lost with it, which
    makes their pipeline restore (engine.lifecycle.settle_job, engine.recovery)."""
    lost = list(
        TaskGroup.objects.exclude(status__in=EXECUTION_TERMINAL)
        .exclude(status=ExecutionStatus.CREATED)
        .exclude(member__state=MemberState.ALIVE)
        .select_related("member")
        .order_by("job_id", "id")[:500]
    )
    if not lost:
        return False
    count = 0
    for group in lost:
        member = group.member
        reason = (
            f"member {member.name} ({member.uuid}) lost: {member.end_reason or member.state}"
            if member
            else "member lost"
        )
        with fenced(epoch):
            if lifecycle.finish_task_group(
                group.id,
                group.attempt,
                None,
                ExecutionStatus.FAILED,
                reason,
                lost_member_id=group.member_id,
            ):
                count += 1
    log.warning("failed %s task groups of lost members", count)
    return count > 0
