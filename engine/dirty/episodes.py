"""Recovery episodes: completed once the job runs again, expired when stale (an episode is aborted
at the job's end by engine.dirty.history)."""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models.functions import Now

from engine.dirty import events as dirty_events
from engine.dirty.tracking import contained, lock_state, options
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.models import (
    DirtyJobState,
    EngineEvent,
    Job,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from engine.states import (
    EXECUTION_DEPLOYED,
    JOB_TERMINAL,
    AttemptState,
    ControlStepState,
    EpisodeStatus,
    ExecutionStatus,
    JobStatus,
    MemberState,
)

log = logging.getLogger("keel.dirty")


def after_settle(job: Job, pipelines: list[Pipeline], epoch: int | None = None):
    """After a roll-up of a running job (job row locked): complete the active episode once every
    pipeline runs again, nothing prepared waits to deploy and no task group is left on a lost
    member. Never raises."""
    if job.dirty_threshold <= 0 or job.status in JOB_TERMINAL:
        return []
    if any(p.status not in (ExecutionStatus.RUNNING, ExecutionStatus.FINISHED) for p in pipelines):
        return []
    try:
        with transaction.atomic():
            episode_id = (
                DirtyJobState.objects.filter(job_id=job.id)
                .values_list("active_episode_id", flat=True)
                .first()
            )
            if episode_id is None:
                return []  # the common case, without a lock
            # Decide under the state-row lock: a member removal that merged an incident into
            # this episode meanwhile has committed, and this statement sees it.
            state = lock_state(job.id)
            if state is None or state.active_episode_id is None:
                return []
            if not _recovered(job, state.active_episode_id):
                return []
            return end_episode(
                state, state.active_episode_id, EpisodeStatus.COMPLETED, "recovered", epoch
            )
    except Exception as exc:  # the reconciliation completes it later
        return contained(job, epoch, "episode completion", exc, repairable=True)


def _recovered(job: Job, episode_id: int) -> bool:
    states = set(
        RecoveryAttempt.objects.filter(episode_id=episode_id).values_list("state", flat=True)
    )
    if AttemptState.CONFIRMED not in states or AttemptState.PREPARED in states:
        return False
    if TaskGroup.objects.filter(job=job, status=ExecutionStatus.DEPLOYING).exists():
        return False  # a reader restored alone runs again once it reports RUNNING
    return not (TaskGroup.objects.filter(job=job).deployed().on_lost_members().exists())


def end_episode(
    state: DirtyJobState, episode_id: int, status: str, reason: str, epoch: int | None
) -> list[EngineEvent]:
    RecoveryEpisode.objects.filter(id=episode_id, status=EpisodeStatus.ACTIVE).update(
        status=status, ended_at=Now(), end_reason=reason[:1000]
    )
    RecoveryAttempt.objects.filter(episode_id=episode_id, state=AttemptState.PREPARED).update(
        state=AttemptState.ABORTED, ended_at=Now()
    )
    DirtyJobState.objects.filter(job_id=state.job_id, active_episode_id=episode_id).update(
        active_episode=None, updated_at=Now()
    )
    state.active_episode_id = None
    _prune(state.job_id)
    completed = status == EpisodeStatus.COMPLETED
    return [dirty_events.episode_ended(state.job_id, epoch, episode_id, completed, reason)]


def _prune(job_id: int) -> None:
    """Keep the ``event-history-size`` most recent ended episodes of the job, with their
    incidents and attempts: a job's tracking state stays bounded however long it runs.

    An incident is the idempotency key of a member's loss for the job; dropping an old one is
    safe, because a loss is only registered for a job that has a live task group on that
    member, and an ended episode's lost members hold none of this job's any more."""
    keep = options().history_size
    old = list(
        RecoveryEpisode.objects.filter(job_id=job_id)
        .exclude(status=EpisodeStatus.ACTIVE)
        .order_by("-id")
        .values_list("id", flat=True)[keep:]
    )
    if old:
        MemberLossIncident.objects.filter(job_id=job_id, episode_id__in=old).delete()
        RecoveryEpisode.objects.filter(id__in=old).delete()


#: ACTIVE episodes whose pending-incident TTL is over, read on the database's clock (``now()``).
#: The TTL applies only where no restore of the episode can still deploy: none deployed and
#: awaits its confirmation (a PREPARED attempt whose pipeline's restore count reached it: the
#: reconciliation confirms it), no pipeline of the live job is FAILING (its restore waits for
#: slots, or is about to be prepared), no restore step of it is pending (a reader restore of a
#: running pipeline, say) and no task group is left on a lost member (its restore is still to
#: come). Then: it holds an incident older than the TTL that no confirmed attempt followed (or
#: that left a PREPARED attempt that cannot deploy any more); an episode with no incident at
#: all (bound by restore preparation) ages from its start.
_STALE = """
SELECT e.id, e.job_id
  FROM engine_recoveryepisode e
 WHERE e.status = %(active)s
   AND (%(only)s::bigint IS NULL OR e.id = %(only)s::bigint)
   AND NOT EXISTS (SELECT 1 FROM engine_recoveryattempt a
                     JOIN engine_pipeline p ON p.id = a.pipeline_id
                    WHERE a.episode_id = e.id AND a.state = %(prepared)s
                      AND p.restore_count >= a.restore_number)
   AND NOT EXISTS (SELECT 1 FROM engine_pipeline p JOIN engine_job j ON j.id = p.job_id
                    WHERE p.job_id = e.job_id AND p.status = %(failing)s
                      AND j.status = ANY(%(live)s))
   AND NOT EXISTS (SELECT 1 FROM engine_controlstep s
                    WHERE s.job_id = e.job_id AND s.state = %(pending)s)
   AND NOT EXISTS (SELECT 1 FROM engine_taskgroup g JOIN engine_member m ON m.id = g.member_id
                    WHERE g.job_id = e.job_id AND g.status = ANY(%(deployed)s)
                      AND m.state <> %(alive)s)
   AND (EXISTS (SELECT 1 FROM engine_memberlossincident i
                 WHERE i.episode_id = e.id AND i.at < now() - %(ttl)s * interval '1 second'
                   AND (NOT EXISTS (SELECT 1 FROM engine_recoveryattempt a
                                     WHERE a.episode_id = e.id AND a.state = %(confirmed)s
                                       AND a.ended_at >= i.at)
                        OR EXISTS (SELECT 1 FROM engine_recoveryattempt a
                                    WHERE a.episode_id = e.id AND a.state = %(prepared)s)))
        OR (e.started_at < now() - %(ttl)s * interval '1 second'
            AND NOT EXISTS (SELECT 1 FROM engine_memberlossincident i WHERE i.episode_id = e.id)
            AND NOT EXISTS (SELECT 1 FROM engine_recoveryattempt a
                             WHERE a.episode_id = e.id AND a.state = %(confirmed)s)))
 ORDER BY e.id
 LIMIT 100
"""


def _stale(only: int | None = None) -> list[tuple[int, int]]:
    with connection.cursor() as cur:
        cur.execute(
            _STALE,
            {
                "active": EpisodeStatus.ACTIVE,
                "confirmed": AttemptState.CONFIRMED,
                "prepared": AttemptState.PREPARED,
                "failing": ExecutionStatus.FAILING,
                "pending": ControlStepState.PENDING,
                "live": [JobStatus.SCHEDULED.value, JobStatus.RUNNING.value],
                "deployed": sorted(s.value for s in EXECUTION_DEPLOYED),
                "alive": MemberState.ALIVE,
                "ttl": options().pending_incident_ttl,
                "only": only,
            },
        )
        return [(row[0], row[1]) for row in cur.fetchall()]


def expire_stale_episodes(epoch: int) -> bool:
    """Active-master housekeeping: abort episodes with an incident that reached no deployment
    within ``pending-incident-ttl`` of the incident itself, once no restore of the episode can
    still deploy (the seed's bound on a pending incident). A restore that waits for slots keeps
    its episode however long it waits: expiring it would leave its deployment uncounted and the
    job UNKNOWN for ever. Ages are read on the database's clock, never on this master's."""
    did = False
    for episode_id, job_id in _stale():
        try:
            did = _expire(epoch, episode_id, job_id) or did
        except StaleEpoch:
            raise
        except Exception:
            log.exception("expiring episode %s of job %s failed; it is retried", episode_id, job_id)
    return did


def _expire(epoch: int, episode_id: int, job_id: int) -> bool:
    with fenced(epoch):
        job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
        state = lock_state(job_id)
        # Re-checked under the locks: a deployment may have reached the incident meanwhile.
        if (
            job is None
            or state is None
            or state.active_episode_id != episode_id
            or not _stale(only=episode_id)
        ):
            return False
        append_events(
            end_episode(
                state,
                episode_id,
                EpisodeStatus.ABORTED,
                "expired: an incident reached no deployment within "
                "engine.dirty-task.pending-incident-ttl, and no restore of it can deploy",
                epoch,
            )
        )
        return True
