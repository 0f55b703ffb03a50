"""Every enumeration of the engine: state machines with their named terminal sets and valid
transitions, and the other closed sets of values the engine stores or compares."""

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


SlotMode = models.TextChoices("SlotMode", "FIXED DYNAMIC")


SlotState = models.TextChoices("SlotState", "FREE ASSIGNED")


CandidateState = models.TextChoices("CandidateState", "ACTIVE STANDBY STOPPED")


def check_transition(table: dict, current: str, target: str) -> None:
    """Raise InvalidTransition unless ``current -> target`` is an edge of ``table``."""
    if target not in table.get(current, frozenset()):
        raise InvalidTransition(f"{current} -> {target} is not a valid transition")


def transition_path(table: dict, current: str, target: str) -> list[str]:
    """The shortest walk of valid transitions from ``current`` to ``target`` (excluding current).

    A roll-up can learn several things at once (a batch reader ran and finished before its
    pipeline was seen RUNNING); each edge is still taken, and recorded, one by one.
    """
    frontier, seen = [[current]], {current}
    while frontier:
        walk = frontier.pop(0)
        if walk[-1] == target:
            return walk[1:]
        for nxt in sorted(table.get(walk[-1], ())):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append([*walk, nxt])
    raise InvalidTransition(f"no valid path {current} -> {target}")


JobStatus = models.TextChoices(
    "JobStatus", "CREATED PENDING SCHEDULED RUNNING FAILING FAILED CANCELING CANCELED FINISHED"
)

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


#: Pipeline and task-group states (Zeta's names).
ExecutionStatus = models.TextChoices(
    "ExecutionStatus", "CREATED DEPLOYING RUNNING FAILING FAILED CANCELING CANCELED FINISHED"
)

EXECUTION_TERMINAL = frozenset(
    {ExecutionStatus.FAILED, ExecutionStatus.CANCELED, ExecutionStatus.FINISHED}
)
#: Not ended (what a status index finds among every ended one).
EXECUTION_LIVE = frozenset(ExecutionStatus) - EXECUTION_TERMINAL
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


#: Task groups that hold (or are about to hold) a slot on a member: deployed and not ended.
EXECUTION_DEPLOYED = frozenset(ExecutionStatus) - EXECUTION_TERMINAL - {ExecutionStatus.CREATED}


TaskGroupKind = models.TextChoices("TaskGroupKind", "ENUMERATOR READER")


JobMode = models.TextChoices("JobMode", "BATCH STREAMING")


ControlStepState = models.TextChoices("ControlStepState", "PENDING DONE")


#: A restore of a whole pipeline, or of some readers of a running Lane A pipeline alone, or a
#: Lane A pipeline's restore at another parallelism (a rescale, engine.jobs.rescale).
ControlStepKind = models.TextChoices(
    "ControlStepKind",
    [
        ("RESTORE_PIPELINE", "restore-pipeline"),
        ("RESTORE_READERS", "restore-readers"),
        ("RESCALE_PIPELINE", "rescale-pipeline"),
    ],
)
RESTORE_KINDS = frozenset(ControlStepKind)


CheckpointState = models.TextChoices("CheckpointState", "PENDING COMPLETED FAILED")


#: A cleanup record: PENDING until due and executed; RUNNING while an execution holds it (its
#: transaction); DONE once executed; FAILED after too many failed attempts (retried by hand).
CleanupState = models.TextChoices("CleanupState", "PENDING RUNNING DONE FAILED")
CLEANUP_OPEN = (CleanupState.PENDING, CleanupState.RUNNING)

#: What a cleanup record removes: a finished job's running state (after the cleanup delay), or
#: its history (after the history retention).
CleanupKind = models.TextChoices("CleanupKind", "JOB_STATE HISTORY")


class EpisodeStatus(models.TextChoices):
    """A recovery episode: ACTIVE until the job runs again (COMPLETED) or cannot (ABORTED)."""

    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


class AttemptState(models.TextChoices):
    """A deployment attempt: PREPARED with its restore, CONFIRMED (counted) at DEPLOYING."""

    PREPARED = "PREPARED"
    CONFIRMED = "CONFIRMED"
    ABORTED = "ABORTED"


class DirtyEvaluation(models.TextChoices):
    """A job's dirty-job label. DIRTY is irreversible; UNKNOWN while tracking is incomplete."""

    CLEAN = "CLEAN"
    DIRTY = "DIRTY"
    UNKNOWN = "UNKNOWN"
    DISABLED = "DISABLED"


class DrainState(models.TextChoices):
    """A planned leave (drain) of a member, ordered through the authenticated API: DRAINING while
    the active master moves its task groups away; LEFT once it verified the member empty and
    ended it; ABORTED if the member ended otherwise first (a crash, its own SIGTERM); EXPIRED if
    the drain did not finish within ``engine.drain.timeout`` (the member takes work again)."""

    DRAINING = "DRAINING"
    LEFT = "LEFT"
    ABORTED = "ABORTED"
    EXPIRED = "EXPIRED"


DRAIN_ENDED = frozenset({DrainState.LEFT, DrainState.ABORTED, DrainState.EXPIRED})


class LeaveClassification(models.TextChoices):
    """Why a member left, as far as the cluster can trust it. Every loss is UNCLASSIFIED until a
    trusted planned-leave control plane registers PLANNED_VERIFIED before the member stops."""

    UNCLASSIFIED = "UNCLASSIFIED"
    PLANNED_VERIFIED = "PLANNED_VERIFIED"
