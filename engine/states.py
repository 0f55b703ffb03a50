"""Explicit state machines of the engine: constants, named terminal sets, validated transitions."""

from __future__ import annotations

from django.db import models


class InvalidTransition(ValueError):
    """A state change that the state machine does not allow."""


class MemberState(models.TextChoices):
    ALIVE = "ALIVE"
    #: Declared dead by the active master (heartbeat timeout or its database session ended).
    REMOVED = "REMOVED"
    #: Stopped gracefully (SIGTERM) and said so itself.
    LEFT = "LEFT"


MEMBER_TERMINAL = frozenset({MemberState.REMOVED, MemberState.LEFT})
MEMBER_TRANSITIONS = {
    MemberState.ALIVE: frozenset({MemberState.REMOVED, MemberState.LEFT}),
    MemberState.REMOVED: frozenset(),
    MemberState.LEFT: frozenset(),
}


class SlotMode(models.TextChoices):
    FIXED = "FIXED"
    DYNAMIC = "DYNAMIC"


class SlotState(models.TextChoices):
    FREE = "FREE"
    ASSIGNED = "ASSIGNED"


class CandidateState(models.TextChoices):
    ACTIVE = "ACTIVE"
    STANDBY = "STANDBY"
    STOPPED = "STOPPED"


def check_transition(table: dict, current: str, target: str) -> None:
    """Raise InvalidTransition unless ``current -> target`` is an edge of ``table``."""
    if target not in table.get(current, frozenset()):
        raise InvalidTransition(f"{current} -> {target} is not a valid transition")


class JobStatus(models.TextChoices):
    CREATED = "CREATED"
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"


JOB_TERMINAL = frozenset({JobStatus.FAILED, JobStatus.CANCELED, JobStatus.FINISHED})
JOB_TRANSITIONS = {
    JobStatus.CREATED: frozenset({JobStatus.PENDING, JobStatus.CANCELED, JobStatus.FAILED}),
    JobStatus.PENDING: frozenset({JobStatus.SCHEDULED, JobStatus.CANCELED, JobStatus.FAILED}),
    JobStatus.SCHEDULED: frozenset(
        {JobStatus.RUNNING, JobStatus.FAILING, JobStatus.CANCELING, JobStatus.PENDING}
    ),
    JobStatus.RUNNING: frozenset({JobStatus.FINISHED, JobStatus.FAILING, JobStatus.CANCELING}),
    JobStatus.FAILING: frozenset({JobStatus.FAILED}),
    JobStatus.CANCELING: frozenset({JobStatus.CANCELED}),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELED: frozenset(),
    JobStatus.FINISHED: frozenset(),
}


class ExecutionStatus(models.TextChoices):
    """Pipeline and task-group states (Zeta's names)."""

    CREATED = "CREATED"
    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"


EXECUTION_TERMINAL = frozenset(
    {ExecutionStatus.FAILED, ExecutionStatus.CANCELED, ExecutionStatus.FINISHED}
)
EXECUTION_TRANSITIONS = {
    ExecutionStatus.CREATED: frozenset(
        {ExecutionStatus.DEPLOYING, ExecutionStatus.CANCELED, ExecutionStatus.FAILED}
    ),
    ExecutionStatus.DEPLOYING: frozenset(
        {
            ExecutionStatus.RUNNING,
            ExecutionStatus.FAILING,
            ExecutionStatus.CANCELING,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELED,
        }
    ),
    ExecutionStatus.RUNNING: frozenset(
        {
            ExecutionStatus.FINISHED,
            ExecutionStatus.FAILING,
            ExecutionStatus.CANCELING,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELED,
        }
    ),
    # FAILING -> DEPLOYING: a pipeline that lost a member restores (redeploys every task group).
    ExecutionStatus.FAILING: frozenset({ExecutionStatus.FAILED, ExecutionStatus.DEPLOYING}),
    ExecutionStatus.CANCELING: frozenset({ExecutionStatus.CANCELED}),
    ExecutionStatus.FAILED: frozenset(),
    ExecutionStatus.CANCELED: frozenset(),
    ExecutionStatus.FINISHED: frozenset(),
}


class TaskGroupKind(models.TextChoices):
    ENUMERATOR = "ENUMERATOR"
    READER = "READER"
