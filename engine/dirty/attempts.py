"""Deployment attempts: allocated when a pipeline restore is prepared, confirmed (and counted)
when it reaches DEPLOYING, aborted when the restore becomes obsolete."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from engine import counters
from engine.dirty import events as dirty_events
from engine.dirty.member_loss import merge_incidents
from engine.dirty.tracking import (
    classify_leave,
    contained,
    incomplete,
    lock_state,
)
from engine.models import (
    DirtyJobState,
    EngineEvent,
    Job,
    Member,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
)
from engine.states import AttemptState, LeaveClassification


def on_restore_prepared(
    job: Job,
    pipeline: Pipeline,
    restore_number: int,
    lost_member_ids: list[int],
    epoch: int | None = None,
) -> list[EngineEvent]:
    """A pipeline restore is prepared (its durable restore step was just created; the job row is
    locked by the caller): allocate the attempt ``<episode>-<pipeline>-<sequence>``, PREPARED.

    Losses not registered yet (a task group deployed to a member in the instant it was removed)
    are merged first: the incident key makes that idempotent. Never raises.
    """
    if job.dirty_threshold <= 0:
        return []
    try:
        with transaction.atomic():
            return _prepare(job, pipeline, restore_number, lost_member_ids, epoch)
    except Exception as exc:  # no attempt id for this restore: it can never be counted exactly
        return contained(job, epoch, "restore preparation", exc, repairable=False)


def _prepare(job, pipeline, restore_number, lost_member_ids, epoch) -> list[EngineEvent]:
    state = lock_state(job.id)
    if state is None:
        return []  # missing state: the job evaluates UNKNOWN already
    events: list[EngineEvent] = []
    if RecoveryAttempt.objects.filter(pipeline=pipeline, restore_number=restore_number).exists():
        return []  # this restore was prepared before: a duplicate
    for member in Member.objects.filter(id__in=lost_member_ids).order_by("id"):
        events += merge_incidents(member, epoch, classify_leave(member), job.id)
    state.refresh_from_db()
    if state.active_episode_id is None:
        # Member loss restored a pipeline, but every loss involved was already part of an
        # ended episode: bind to a new one so the attempt is not lost, and say we are unsure.
        episode = RecoveryEpisode.objects.create(
            job=job, classification=LeaveClassification.UNCLASSIFIED
        )
        DirtyJobState.objects.filter(job_id=job.id).update(
            active_episode=episode, recovery_episode_count=state.recovery_episode_count + 1
        )
        state.active_episode_id = episode.id
        events += incomplete(
            state,
            epoch,
            f"restore {restore_number} of pipeline "
            f"{pipeline.index} without an active recovery episode",
        )
    episode_id = state.active_episode_id
    last = (
        RecoveryAttempt.objects.filter(episode_id=episode_id, pipeline=pipeline)
        .order_by("-prepare_sequence")
        .values_list("prepare_sequence", flat=True)
        .first()
    )
    sequence = (last or 0) + 1
    attempt = RecoveryAttempt.objects.create(
        attempt_id=f"{episode_id}-{pipeline.index}-{sequence}",
        job=job,
        episode_id=episode_id,
        pipeline=pipeline,
        prepare_sequence=sequence,
        restore_number=restore_number,
    )
    RecoveryEpisode.objects.filter(id=episode_id).update(last_activity_at=Now())
    events.append(
        dirty_events.attempt_prepared(
            job.id, epoch, attempt.attempt_id, episode_id, pipeline.index, sequence
        )
    )
    return events


def on_restore_deploying(
    job: Job, pipeline: Pipeline, restore_number: int, epoch: int | None
) -> list[EngineEvent]:
    """The restored pipeline reached DEPLOYING on its new slots (same transaction): confirm its
    attempt. Never raises."""
    if job.dirty_threshold <= 0:
        return []
    try:
        with transaction.atomic():
            state = lock_state(job.id)
            if state is None:
                return []
            attempt = RecoveryAttempt.objects.filter(
                pipeline=pipeline, restore_number=restore_number
            ).first()
            if attempt is None:
                return incomplete(
                    state,
                    epoch,
                    f"pipeline {pipeline.index} redeployed (restore {restore_number}) without a "
                    "prepared attempt",
                )
            return confirm(state, attempt, epoch)
    except Exception as exc:  # the reconciliation confirms it from the pipeline's restore count
        return contained(job, epoch, "attempt confirmation", exc, repairable=True)


def confirm(state: DirtyJobState, attempt: RecoveryAttempt, epoch: int | None) -> list[EngineEvent]:
    """PREPARED -> CONFIRMED; count if the episode's generation advances. Idempotent."""
    if attempt.state == AttemptState.CONFIRMED:
        return []  # a duplicate confirmation
    if attempt.state != AttemptState.PREPARED:
        return incomplete(state, epoch, f"attempt {attempt.attempt_id} deployed after it ended")
    RecoveryAttempt.objects.filter(id=attempt.id).update(
        state=AttemptState.CONFIRMED, ended_at=Now()
    )
    episode = RecoveryEpisode.objects.select_for_update(no_key=True).get(id=attempt.episode_id)
    generation = max(episode.generation, attempt.prepare_sequence)
    # An episode of planned leaves alone counts nothing; once an UNCLASSIFIED incident joined
    # it, every generation it has not counted yet counts (the seed's phase-2 rule).
    planned = episode.classification == LeaveClassification.PLANNED_VERIFIED
    delta = 0 if planned else generation - episode.counted_generation
    counted = delta > 0
    events: list[EngineEvent] = []
    fields: dict = {"updated_at": Now()}
    RecoveryEpisode.objects.filter(id=episode.id).update(
        generation=generation,
        counted_generation=episode.counted_generation + delta,
        last_activity_at=Now(),
    )
    if counted:
        counters.bump([(counters.RECOVERY_ATTEMPTS, "", delta)])
        state.recovery_attempt_count += delta
        fields.update(recovery_attempt_count=state.recovery_attempt_count, last_counted_at=Now())
        if not state.dirty and state.recovery_attempt_count >= state.threshold:
            state.dirty = True
            fields.update(dirty=True, first_dirty_at=Now())
            counters.bump([(counters.DIRTY_TRANSITIONS, "", 1)])
            events.append(
                dirty_events.marked(
                    state.job_id,
                    epoch,
                    state.recovery_attempt_count,
                    state.threshold,
                    attempt.attempt_id,
                )
            )
    DirtyJobState.objects.filter(job_id=state.job_id).update(**fields)
    events.insert(
        0,
        dirty_events.attempt_confirmed(
            state.job_id,
            epoch,
            attempt.attempt_id,
            episode.id,
            generation,
            counted,
            state.recovery_attempt_count,
        ),
    )
    return events


def deployed_unconfirmed(job_id: int):
    """PREPARED attempts of the job whose deployment happened (their pipeline's restore count
    reached them): a confirmation that failed, still to redo."""
    return RecoveryAttempt.objects.filter(
        job_id=job_id,
        state=AttemptState.PREPARED,
        pipeline__restore_count__gte=F("restore_number"),
    )


def confirm_deployed(state: DirtyJobState, epoch: int | None) -> list[EngineEvent]:
    """Confirm every deployed attempt of the job whose confirmation failed (state row locked):
    before the job's end freezes its count, so the deployment is counted, not lost."""
    events: list[EngineEvent] = []
    for attempt in deployed_unconfirmed(state.job_id).order_by("id"):
        events += confirm(state, attempt, epoch)
    return events


def on_restore_obsolete(job: Job, pipeline: Pipeline, restore_number: int, epoch: int | None):
    """A restore step found nothing to do (its job is stopping, or the pipeline moved on): its
    attempt, if the pipeline never got that deployment, will never deploy. Never raises."""
    if job.dirty_threshold <= 0 or pipeline.restore_count >= restore_number:
        return []
    try:
        with transaction.atomic():
            if lock_state(job.id) is None:
                return []
            prepared = RecoveryAttempt.objects.filter(
                pipeline=pipeline, restore_number=restore_number, state=AttemptState.PREPARED
            )
            ended = list(prepared.values_list("attempt_id", flat=True))
            prepared.update(state=AttemptState.ABORTED, ended_at=Now())
            return [
                dirty_events.attempt_aborted(
                    job.id, epoch, attempt_id, pipeline.index, restore_number, "restore obsolete"
                )
                for attempt_id in ended
            ]
    except Exception as exc:
        return contained(job, epoch, "obsolete restore", exc, repairable=True)
