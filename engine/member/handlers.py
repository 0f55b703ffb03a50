"""The Celery tasks of the commands a member receives on ``member.<name>``.

Handlers own no state: each checks that the command is addressed to this member, validates it,
and hands it to the member runtime. The master sends them by name (engine.protocol), never by
importing this module.
"""

from __future__ import annotations

import logging
import time

from celery import shared_task

from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.member import runtime
from engine.member.mailbox import Abort, Barrier, Commit
from engine.models import TaskGroup
from engine.protocol import (
    TASK_ABORT,
    TASK_BARRIER,
    TASK_CANCEL,
    TASK_COMMIT,
    TASK_DEPLOY,
    TASK_GRACEFUL_CLOSE,
    TASK_MEMBER_COMMANDS,
    TASK_MEMBER_PING,
    TASK_PLAN_JOB,
    TASK_SOURCE_ACK,
    TASK_SOURCE_COMMAND,
    member_queue,
)
from engine.sourceruntime.choices import AdmissionStatus
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.states import ExecutionStatus

log = logging.getLogger("keel.handlers")
NOT_ADDRESSED = {"ok": False, "reason": "command for another member"}


@shared_task(name=TASK_MEMBER_PING, acks_late=False)
def member_ping(expected_name: str | None = None) -> dict:
    """Answer with the identity of the member that consumed the command (a liveness probe)."""
    here = runtime.current()
    if here is None:
        return {"ok": False, "error": "not a member process"}
    member = here.member
    return {
        "ok": expected_name is None or expected_name == member.name,
        "memberUuid": str(member.uuid),
        "name": member.name,
    }


@shared_task(name=TASK_DEPLOY, acks_late=False, ignore_result=True)
def deploy_task_group(task_group_id: int, attempt: int, member_uuid: str) -> dict:
    """Deploy one attempt of a task group here. Validates, then hands it to the runtime."""
    here = runtime.addressed(member_uuid)
    if here is None:
        return NOT_ADDRESSED
    group = (
        TaskGroup.objects.filter(id=task_group_id).values("attempt", "member_id", "status").first()
    )
    if group is None:
        return {"ok": False, "reason": "unknown task group"}
    if group["attempt"] != attempt or group["member_id"] != here.member.id:
        return {"ok": False, "reason": "stale attempt"}
    if group["status"] != ExecutionStatus.DEPLOYING:
        return {"ok": False, "reason": f"task group is {group['status']}"}
    return {"ok": True, "result": here.deploy(task_group_id, attempt)}


@shared_task(name=TASK_CANCEL, acks_late=False, ignore_result=True)
def cancel_task_group(task_group_id: int, attempt: int, member_uuid: str) -> dict:
    here = runtime.addressed(member_uuid)
    if here is None:
        return NOT_ADDRESSED
    return {"ok": True, "result": here.cancel(task_group_id, attempt)}


def _mailbox_command(message: type[Barrier] | type[Commit] | type[Abort]):
    """A checkpoint command: offer ``message(checkpoint_id)`` to the task group's mailbox, where
    it is handled between two batches (a barrier cuts the data there, a commit or an abort
    follows it)."""

    def offer(task_group_id: int, attempt: int, member_uuid: str, checkpoint_id: int) -> dict:
        here = runtime.addressed(member_uuid)
        if here is None:
            return NOT_ADDRESSED
        return {"ok": here.offer(task_group_id, attempt, message(checkpoint_id))}

    return offer


checkpoint_barrier = shared_task(name=TASK_BARRIER, acks_late=False, ignore_result=True)(
    _mailbox_command(Barrier)
)
checkpoint_commit = shared_task(name=TASK_COMMIT, acks_late=False, ignore_result=True)(
    _mailbox_command(Commit)
)
checkpoint_abort = shared_task(name=TASK_ABORT, acks_late=False, ignore_result=True)(
    _mailbox_command(Abort)
)


@shared_task(name=TASK_GRACEFUL_CLOSE, acks_late=False, ignore_result=True)
def graceful_close(task_group_id: int, attempt: int, member_uuid: str) -> dict:
    """A member drain's graceful close for a Lane A reader attempt here: admitted into its
    mailbox as GRACEFUL_CLOSE (once; a repeat is acknowledged)."""
    here = runtime.addressed(member_uuid)
    if here is None:
        return NOT_ADDRESSED
    return {"ok": here.close_gracefully(task_group_id, attempt)}


@shared_task(name=TASK_SOURCE_COMMAND, acks_late=False, ignore_result=True)
def source_command(
    task_group_id: int, attempt: int, member_uuid: str, wire: str, reply: list
) -> dict:
    """An enumerator's command for a Lane A reader: admitted into its mailbox or refused, at
    once (no connector code, no waiting), and the AdmissionAck sent back to the enumerator
    (``reply``: its task group, attempt, member uuid and name)."""
    here = runtime.addressed(member_uuid)
    if here is None:
        return NOT_ADDRESSED  # the enumerator sends it again
    try:
        envelope = SourceCommandEnvelope.from_wire(wire)
    except (ValueError, TypeError, KeyError):
        return {"ok": False, "reason": "not an envelope"}
    ack = here.admit(task_group_id, attempt, envelope)
    answer = {"commandId": envelope.commandId, "ack": ack.to_json()}
    if len(reply) > 4:  # the publish's time: the enumerator measures the hop to admission
        answer.update(sentAt=reply[4], admittedAt=time.time())
    # Batched: a hundred answers a second to one enumerator's member must not cost a message
    # each (its consumer thread competes for the GIL with every busy reader there).
    args = [reply[0], reply[1], reply[2], answer]
    here.outbox.put(TASK_SOURCE_ACK, args, member_queue(reply[3]), batch=True)
    return {"ok": ack.status == AdmissionStatus.ACCEPTED, **answer}


@shared_task(name=TASK_SOURCE_ACK, acks_late=False, ignore_result=True)
def source_ack(task_group_id: int, attempt: int, member_uuid: str, answer: dict) -> dict:
    """A reader's message for a Lane A enumerator here (an AdmissionAck, or what
    engine.member.enumerator_link sends): posted to its coordinator loop."""
    here = runtime.addressed(member_uuid)
    if here is None:
        return NOT_ADDRESSED
    return {"ok": here.source_ack(task_group_id, attempt, answer)}


@shared_task(name=TASK_PLAN_JOB, acks_late=False)
def plan_job_here(text: str, job_name: str | None, variables: dict) -> dict:
    """Plan a job whose checks connect to databases, for the web process (which opens no
    connection a job names). Read-only, so a repeat is harmless. ``{plan}`` or ``{errors}``."""
    try:
        return {"plan": plan_job(text, job_name, variables).to_json()}
    except ConfigError as exc:
        return {"errors": exc.errors}


#: The commands that may share a message (TASK_MEMBER_COMMANDS), by task name.
BATCHABLE = {
    TASK_DEPLOY: deploy_task_group.run,
    TASK_CANCEL: cancel_task_group.run,
    TASK_BARRIER: checkpoint_barrier.run,
    TASK_COMMIT: checkpoint_commit.run,
    TASK_ABORT: checkpoint_abort.run,
    TASK_GRACEFUL_CLOSE: graceful_close.run,
    TASK_SOURCE_COMMAND: source_command.run,
    TASK_SOURCE_ACK: source_ack.run,
}


@shared_task(name=TASK_MEMBER_COMMANDS, acks_late=False, ignore_result=True)
def member_commands(commands: list) -> int:
    """Several commands for this member in one message, run in their order as each one's own
    task would run it; one that fails is logged and the others still run (each re-states an
    intent its sender sends again). Returns how many ran."""
    ran = 0
    for entry in commands:
        try:
            task, args = entry
            handler = BATCHABLE[task]
        except (KeyError, TypeError, ValueError):
            log.warning("a batched command that is not one: %.200r", entry)
            continue
        try:
            handler(*args)
            ran += 1
        except Exception:
            log.exception("batched command %s%.200r failed", task, tuple(args))
    return ran
