"""The active master's job orchestration steps: schedule, deliver, cancel, fail lost work.

Each step reads its intent from PostgreSQL (job and task-group states), so a new active master
picks up exactly where a dead one stopped; commands are idempotent and re-sent until the state
they aim at is reached.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db.models.functions import Now
from django.utils import timezone

from engine import dirty
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs import checkpoint_aborts, checkpoints, drain, lifecycle, terminal
from engine.jobs.scheduler import Deployment, schedule_next
from engine.master import commands
from engine.models import Checkpoint, TaskGroup
from engine.states import (
    ExecutionStatus,
)

log = logging.getLogger("keel.orchestration")
REDELIVER_AFTER = 5.0
DEPLOY_TIMEOUT = 60.0
CANCEL_RESEND = 2.0


def schedule(epoch: int) -> bool:
    deployments = schedule_next(epoch)
    if not deployments:
        return False
    commands.deploy(deployments)
    return True


def redeliver(epoch: int) -> bool:
    """Re-send deploy commands that have not been acted on (lost message, dead master), and
    fail deployments a live member has not taken up within DEPLOY_TIMEOUT (its consumer is
    stuck): a job must never wait on a command for ever."""
    with fenced(epoch):
        stale = list(
            TaskGroup.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .on_alive_members()
            .filter(
                status=ExecutionStatus.DEPLOYING,
                deployed_at__lt=Now() - timedelta(seconds=REDELIVER_AFTER),
            )
            .values_list(*Deployment.FIELDS, "updated_at")[:200]
        )
        if stale:
            TaskGroup.objects.filter(id__in=[s[0] for s in stale]).update(deployed_at=Now())
    if not stale:
        return False
    cutoff = timezone.now() - timedelta(seconds=DEPLOY_TIMEOUT)
    for row in stale:
        target, since = Deployment.of(row), row[-1]
        if since < cutoff:
            with fenced(epoch):
                lifecycle.finish_task_group(
                    target.task_group_id,
                    target.attempt,
                    None,
                    ExecutionStatus.FAILED,
                    f"member {target.member_name} ({target.member_uuid}) did not take up the "
                    f"deployment within {DEPLOY_TIMEOUT:.0f}s",
                )
            continue
        commands.deploy([target])
    log.info("re-sent %s deploy commands", len(stale))
    return True


class CancelSender:
    """Sends cancel commands to task groups of CANCELING / FAILING jobs until they end."""

    def __init__(self) -> None:
        self.sent: dict[Deployment, float] = {}

    def step(self, epoch: int) -> bool:
        groups = [
            Deployment.of(row)
            for row in TaskGroup.objects.stopping().values_list(*Deployment.FIELDS)[:500]
        ]
        now = time.monotonic()
        due = [g for g in groups if now - self.sent.get(g, 0) >= CANCEL_RESEND]
        for target in due:
            commands.cancel(target)
            self.sent[target] = now
        live = set(groups)
        self.sent = {k: v for k, v in self.sent.items() if k in live}
        return bool(due)


#: Jobs whose lost task groups one fenced transaction fails.
LOST_JOBS_PER_TRANSACTION = 20


def fail_lost_task_groups(epoch: int) -> bool:
    """Task groups whose member is gone can never report: fail them as lost with it, which
    makes their pipeline restore (engine.jobs.lifecycle, engine.jobs.recovery)."""
    lost = list(
        TaskGroup.objects.deployed()
        .on_lost_members()
        .select_related("member")
        .order_by("job_id", "id")[:500]
    )
    if not lost:
        return False
    by_job: dict[int, list[tuple[int, int, int, str]]] = {}
    for group in lost:
        member = group.member
        reason = (
            f"member {member.name} ({member.uuid}) lost: {member.end_reason or member.state}"
            if member
            else "member lost"
        )
        by_job.setdefault(group.job_id, []).append(
            (group.id, group.attempt, group.member_id, reason)
        )
    # A few jobs a transaction, in job order (the lock order): after a member loss every job
    # it hosted has groups to fail, and a transaction each was most of the recovery's time.
    jobs = sorted(by_job)
    count = 0
    for start in range(0, len(jobs), LOST_JOBS_PER_TRANSACTION):
        with fenced(epoch):
            events = []
            for job_id in jobs[start : start + LOST_JOBS_PER_TRANSACTION]:
                ended = lifecycle.fail_lost_task_groups(job_id, by_job[job_id])
                count += sum(1 for event in ended if event.kind == "taskgroup.status")
                events += ended
            append_events(events)  # last: the append lock never waits for a job row
    log.warning("failed %s task groups of lost members", count)
    return count > 0


def drain_members(epoch: int) -> bool:
    """Move drained members' task groups away and let the empty ones leave
    (engine.jobs.drain), their Lane A readers asked to close gracefully first; tell the
    workers to stop the attempts moved."""
    did, moved = drain.step(epoch, commands.graceful_close)
    for target in moved:
        commands.cancel(target)
    return did


def coordinate_checkpoints(epoch: int, trigger: bool = True) -> bool:
    """End the checkpoints that can end, telling readers to commit each completed one as soon
    as it is, and the task groups a failed one expected that it aborted; send again the
    barriers still unacked; then trigger the checkpoints that are due and send their barriers
    (unless not ``trigger``: a recovery is under way)."""

    def send_commits(completed: list[Checkpoint]) -> None:
        for checkpoint_id, target in checkpoints.committers(completed):
            commands.commit(target, checkpoint_id)

    def send_aborts(failed: list[Checkpoint]) -> None:
        for checkpoint_id, target in checkpoint_aborts.told_of_abort(failed):
            commands.abort(target, checkpoint_id)

    ended = checkpoints.complete_or_expire(epoch, send_commits, send_aborts)
    barriers = checkpoints.unacked_barriers(epoch)
    if trigger:
        barriers += checkpoints.trigger_due(epoch)
    for checkpoint_id, target in barriers:
        commands.barrier(target, checkpoint_id)
    return bool(ended or barriers)


def reconcile(epoch: int, settled_for: float = 0.0) -> int:
    """What a new active master settles before it schedules anything, and again as
    housekeeping: the dirty-job tracker's reconciliation (returns the attempts it changed;
    ``settled_for``: engine.dirty.reconcile), then the finished-job records that could not be
    written at the jobs' end."""
    changed = dirty.reconcile(epoch, settled_for)
    terminal.record_pending_history(epoch)
    return changed
