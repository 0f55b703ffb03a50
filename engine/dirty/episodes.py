"""Recovery episodes: completed once the job runs again, expired when stale (an episode is aborted
at the job's end by engine.dirty.history)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from engine.dirty import events as dirty_events
from engine.dirty.tracking import contained, lock_state, options
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.models import (
    DirtyJobState,
    EngineEvent,
    Job,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from engine.states import (
    JOB_TERMINAL,
    AttemptState,
    EpisodeStatus,
    ExecutionStatus,
    JobStatus,
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
    """Keep the ``event-history-size`` most recent episodes of the job (incidents stay: they
    are the idempotency keys, one small row per member lost)."""
    keep = options().history_size
    old = list(
        RecoveryEpisode.objects.filter(job_id=job_id)
        .exclude(status=EpisodeStatus.ACTIVE)
        .order_by("-id")
        .values_list("id", flat=True)[keep:]
    )
    if old:
        RecoveryEpisode.objects.filter(id__in=old).delete()


def expire_stale_episodes(epoch: int) -> bool:
    """Active-master housekeeping: abort episodes idle for ``pending-incident-ttl`` that have no
    prepared restore still able to deploy (stale incidents that never reach deployment)."""

    cutoff = timezone.now() - timedelta(seconds=options().pending_incident_ttl)
    waiting = RecoveryAttempt.objects.filter(
        episode_id=OuterRef("id"),
        state=AttemptState.PREPARED,
        pipeline__status=ExecutionStatus.FAILING,
        pipeline__restore_count=F("restore_number") - 1,
        job__status__in=[JobStatus.SCHEDULED, JobStatus.RUNNING],
    )
    stale = list(
        RecoveryEpisode.objects.filter(status=EpisodeStatus.ACTIVE, last_activity_at__lt=cutoff)
        .exclude(Exists(waiting))
        .order_by("last_activity_at", "id")
        .values_list("id", "job_id")[:100]
    )
    did = False
    for episode_id, job_id in stale:
        try:
            did = _expire(epoch, episode_id, job_id, cutoff) or did
        except StaleEpoch:
            raise
        except Exception:
            log.exception("expiring episode %s of job %s failed; it is retried", episode_id, job_id)
    return did


def _expire(epoch: int, episode_id: int, job_id: int, cutoff) -> bool:

    with fenced(epoch):
        job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
        state = lock_state(job_id)
        # Re-checked under the locks: a loss or a deployment may have renewed it meanwhile.
        episode = RecoveryEpisode.objects.filter(id=episode_id).first()
        if (
            job is None
            or state is None
            or episode is None
            or state.active_episode_id != episode_id
            or episode.last_activity_at >= cutoff
            or _pending(job, episode_id)
        ):
            return False
        append_events(
            end_episode(
                state,
                episode_id,
                EpisodeStatus.ABORTED,
                "expired: no deployment within engine.dirty-task.pending-incident-ttl",
                epoch,
            )
        )
        return True


def _pending(job: Job, episode_id: int) -> bool:
    """A PREPARED attempt whose pipeline still waits for exactly that restore."""
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return False
    for attempt in RecoveryAttempt.objects.filter(
        episode_id=episode_id, state=AttemptState.PREPARED
    ).select_related("pipeline"):
        p = attempt.pipeline
        if p.status == ExecutionStatus.FAILING and p.restore_count == attempt.restore_number - 1:
            return True
    return False
