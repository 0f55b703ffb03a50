"""The tracker's part of a finished job's record (engine.jobs.terminal writes the record).

Its summary and recent episodes are frozen into the record and the running state is removed, in
the record's transaction: if the record cannot be written, the running state stays (DIRTY is
never lost), reads go on from it, and the record is written later. Before the summary is
frozen, a deployment whose confirmation failed is confirmed, and so counted: every repairable
gap is then repaired, and goes with the rest.
"""

from __future__ import annotations

from engine.dirty import events as dirty_events
from engine.dirty.attempts import confirm_deployed
from engine.dirty.episodes import end_episode
from engine.dirty.reading import Sequences, episode_list, summary
from engine.dirty.tracking import contained, lock_state
from engine.models import (
    DirtyJobState,
    DirtyTrackingGap,
    EngineEvent,
    Job,
    MemberLossIncident,
    RecoveryAttempt,
    RecoveryEpisode,
)
from engine.states import JOB_TERMINAL, EpisodeStatus
from history.contributions import HistoryPart


def history_part(job: Job, epoch: int | None) -> HistoryPart:
    """The ended job's summary and episodes; its running state goes with the record. Nothing for
    a job that does not track dirty state.

    In order: deployed attempts whose confirmation failed are confirmed (counted), the
    repairable gaps go (what they stood for is redone: those confirmations, the episode's end
    here, this record), the active episode is aborted, and only then is the summary taken."""
    if job.dirty_threshold <= 0:
        return HistoryPart()
    events = []
    state = lock_state(job.id)
    if state is not None:
        events += confirm_deployed(state, epoch)
        repaired, _ = DirtyTrackingGap.objects.filter(job=job, repairable=True).delete()
        if repaired:
            events.append(dirty_events.repaired(job.id, epoch, repaired))
    if state is not None and state.active_episode_id is not None:
        events += end_episode(
            state, state.active_episode_id, EpisodeStatus.ABORTED, f"job {job.status}", epoch
        )
    snapshot = summary(job, state, Sequences.read(job.id))
    episodes = episode_list(job.id)
    RecoveryAttempt.objects.filter(job=job).delete()
    RecoveryEpisode.objects.filter(job=job).delete()
    MemberLossIncident.objects.filter(job=job).delete()
    DirtyTrackingGap.objects.filter(job=job).delete()
    DirtyJobState.objects.filter(job=job).delete()
    events.append(dirty_events.snapshot(job.id, epoch, snapshot))
    return HistoryPart({"dirty_task": snapshot, "episodes": episodes}, events)


def history_failed(job: Job, epoch: int | None, exc: Exception) -> list[EngineEvent]:
    """The record failed: the running state stays (DIRTY is never lost) and the job's tracking
    reads incomplete until the record is written (a repairable gap)."""
    if job.dirty_threshold <= 0:
        return []
    return contained(job, epoch, "history snapshot", exc, repairable=True)


def pending_history() -> list[int]:
    """Ended jobs whose running state is still here: their record is still to be written."""
    return list(
        DirtyJobState.objects.filter(job__status__in=JOB_TERMINAL)
        .order_by("job_id")
        .values_list("job_id", flat=True)
    )
