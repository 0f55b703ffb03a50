"""Dirty-job (recovery-degraded) tracking: seed 000, phase 1 (docs/decisions/0007-dirty-jobs.md).

A job that enables ``job.dirty-task.threshold`` (> 0) is labelled DIRTY once the number of
job-level deployment attempts caused by member loss reaches the threshold. The label is extra
metadata: the job's status and its retries never change because of it.

Vocabulary (the seed's):
- member-loss incident: one member (by UUID) left and affected one job; idempotent by
  ``(job, lostMemberUuid)``. Registered in the very transaction that ends the membership,
  before the master fails the member's task groups;
- recovery episode: one continuous recovery; it completes when every pipeline of the job runs
  again with every prepared attempt confirmed, aborts when the job ends first or it goes stale;
- deployment attempt ``<episodeId>-<pipelineId>-<prepareSequence>``: allocated when a restore is
  prepared (engine.lifecycle requests it), confirmed when the pipeline reaches DEPLOYING on its
  new slots (engine.recovery). prepareSequence counts per pipeline within the episode;
- generation: the highest confirmed prepareSequence of the episode. ``recoveryAttemptCount``
  rises only when the generation advances: one loss hitting three pipelines counts 1.

Exactness: every change to a job's state takes its row lock, inside the transaction of the state
change it follows (so they commit or vanish together), and appends its EngineEvent there. The
global member-event sequence is bumped before the jobs are scanned. After the event is handled,
every job's watermark advances in one statement: the jobs share one watermark,
``ClusterState.dirty_handled_sequence`` (moved only from ``sequence - 1`` to ``sequence``), and a
job that could not handle an event gets a DirtyTrackingGap row, which freezes its own watermark
just before that event for ever. So a member event costs O(affected jobs), not O(jobs), and a
lagging or missing watermark reads UNKNOWN, never CLEAN. Tracker failures are caught in
savepoints, logged and recorded as ``dirty.tracker-failed`` events: they never block the member
removal, the restore or the job's end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, CharField, Exists, F, IntegerField, OuterRef, Q, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Now
from django.utils import timezone

from .events import append_events
from .fencing import StaleEpoch, fenced
from .models import (
    ClusterState,
    DirtyJobState,
    DirtyTrackingGap,
    EngineEvent,
    Job,
    Member,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from .states import EXECUTION_TERMINAL, JOB_TERMINAL, ExecutionStatus, JobStatus, MemberState

log = logging.getLogger("keel.dirty")

#: The DirtyJobState layout this code reads; a newer row evaluates UNKNOWN.
SCHEMA_VERSION = 1

#: Every member loss is UNCLASSIFIED until a trusted planned-leave control plane exists (phase 2
#: adds PLANNED_VERIFIED, registered by an authenticated operator before the member stops).
UNCLASSIFIED = "UNCLASSIFIED"
PLANNED_VERIFIED = "PLANNED_VERIFIED"

DISABLED, CLEAN, DIRTY, UNKNOWN = "DISABLED", "CLEAN", "DIRTY", "UNKNOWN"
EVALUATIONS = (CLEAN, DIRTY, UNKNOWN, DISABLED)

ES = ExecutionStatus
Episode = RecoveryEpisode
Attempt = RecoveryAttempt


@dataclass(frozen=True)
class Options:
    history_size: int
    pending_incident_ttl: float  # seconds


def options() -> Options:
    engine = settings.ENGINE
    return Options(
        history_size=int(engine["dirty-task.event-history-size"]),
        pending_incident_ttl=float(engine["dirty-task.pending-incident-ttl"]),
    )


def classify_leave(member: Member) -> str:
    """The cause classification of a member loss. A member's own shutdown is never trusted to
    classify itself (a SIGTERM'd pod is as unexplained as a crash): always UNCLASSIFIED."""
    return UNCLASSIFIED


def _event(kind: str, job_id: int, epoch: int | None, **payload) -> EngineEvent:
    return EngineEvent(kind=f"dirty.{kind}", job_id=job_id, epoch=epoch, payload=payload)


def _failed(job_ids: Iterable[int], epoch: int | None, where: str, exc: BaseException):
    """Log and surface a tracker failure (the caller's savepoint rolled its writes back): one
    ``dirty.tracker-failed`` event per job, or one without a job for a cluster-wide step."""
    job_ids = list(job_ids)
    log.error("dirty-job tracking failed (%s) for jobs %s: %s", where, job_ids, exc)
    return [
        EngineEvent(
            kind="dirty.tracker-failed",
            job_id=j,
            epoch=epoch,
            payload={"where": where, "error": str(exc)[:500]},
        )
        for j in job_ids or [None]
    ]


def _record_gap(
    job_id: int, reason: str, sequence: int | None = None, repairable: bool = False
) -> bool:
    """The job cannot be reported CLEAN until this is repaired (or ever, for a missed member
    event). Its own savepoint, no lock on any job row; a failure is logged and returns False."""
    try:
        with transaction.atomic():
            DirtyTrackingGap.objects.create(
                job_id=job_id,
                member_event_sequence=sequence,
                repairable=repairable,
                reason=reason[:1000],
            )
        return True
    except Exception:
        log.exception("could not record a dirty-tracking gap for job %s", job_id)
        return False


def _contained(job: Job, epoch: int | None, where: str, exc: Exception, repairable: bool):
    """A tracker entry point failed: surface it and record the gap; the engine goes on."""
    _record_gap(job.id, f"{where} failed: {exc}", repairable=repairable)
    return _failed([job.id], epoch, where, exc)


# -- submission ------------------------------------------------------------------------------


def init_state(job: Job) -> None:
    """Create the state of an enabled job, in its submit transaction (before it is schedulable).

    A job that is not committed yet has no task group anywhere, so no member event being handled
    meanwhile can concern it: it starts at the shared watermark."""
    if job.dirty_threshold <= 0:
        return
    DirtyJobState.objects.create(job=job, threshold=job.dirty_threshold)


# -- member loss -----------------------------------------------------------------------------

_NOT_AFFECTED = [*sorted(EXECUTION_TERMINAL), ES.CREATED]

#: Lock the state rows of the enabled jobs with live task groups on the lost member, in job
#: order (the lock order of every tracker change).
_LOCK_AFFECTED = """
    SELECT s.job_id
      FROM engine_dirtyjobstate s
     WHERE s.job_id IN (SELECT t.job_id FROM engine_taskgroup t
                         WHERE t.member_id = %(member)s AND t.status <> ALL(%(not_affected)s))
       {only}
     ORDER BY s.job_id
       {lock}
"""

#: With the rows locked (a fresh snapshot sees their latest values): register the incidents not
#: registered yet, open an episode where none is active, and count. One statement whatever the
#: number of jobs.
_MERGE = """
WITH locked AS (
    SELECT s.job_id, s.active_episode_id
      FROM engine_dirtyjobstate s
     WHERE s.job_id = ANY(%(jobs)s::bigint[])
       AND NOT EXISTS (SELECT 1 FROM engine_memberlossincident i
                        WHERE i.job_id = s.job_id AND i.lost_member_uuid = %(uuid)s::uuid)
), opened AS (
    INSERT INTO engine_recoveryepisode
           (job_id, status, classification, generation, started_at, last_activity_at, end_reason)
    SELECT job_id, 'ACTIVE', %(classification)s::text, 0, now(), now(), ''
      FROM locked WHERE active_episode_id IS NULL
    RETURNING id, job_id
), bound AS (
    SELECT l.job_id, COALESCE(l.active_episode_id, o.id) AS episode_id,
           l.active_episode_id IS NULL AS opened
      FROM locked l LEFT JOIN opened o ON o.job_id = l.job_id
), incidents AS (
    INSERT INTO engine_memberlossincident
           (job_id, episode_id, lost_member_uuid, lost_address, classification,
            member_event_sequence, at)
    SELECT job_id, episode_id, %(uuid)s::uuid, %(address)s::text, %(classification)s::text,
           %(sequence)s::bigint, now()
      FROM bound
), continued AS (
    -- An UNCLASSIFIED incident makes its whole episode count (seed: only an episode of
    -- PLANNED_VERIFIED incidents alone may be excluded).
    UPDATE engine_recoveryepisode e
       SET last_activity_at = now(),
           classification = CASE WHEN %(classification)s::text = 'UNCLASSIFIED' THEN 'UNCLASSIFIED'
                                 ELSE e.classification END
      FROM bound b
     WHERE e.id = b.episode_id AND NOT b.opened
), counted AS (
    UPDATE engine_dirtyjobstate s
       SET member_loss_incident_count = s.member_loss_incident_count + 1,
           recovery_episode_count = s.recovery_episode_count + b.opened::int,
           active_episode_id = b.episode_id,
           last_leave_classification = %(classification)s::text,
           last_lost_member_uuid = %(uuid)s::uuid,
           last_lost_address = %(address)s::text,
           updated_at = now()
      FROM bound b
     WHERE s.job_id = b.job_id
)
SELECT job_id, episode_id, opened FROM bound ORDER BY job_id
"""

#: The ``dirty.incident`` events of one member loss, in one statement (MemberLossEvents.append,
#: under the event-append lock: engine.events).
_INCIDENT_EVENTS = """
INSERT INTO engine_engineevent (at, kind, job_id, member_id, epoch, payload)
SELECT now(), 'dirty.incident', v.job_id, NULL, %(epoch)s,
       jsonb_build_object('lostMemberUuid', %(uuid)s::text, 'lostAddress', %(address)s::text,
                          'classification', %(classification)s::text,
                          'episodeId', v.episode_id, 'episodeStarted', v.opened,
                          'memberEventSequence', %(sequence)s::bigint)
  FROM unnest(%(jobs)s::bigint[], %(episodes)s::bigint[], %(opened)s::boolean[])
       AS v(job_id, episode_id, opened)
 ORDER BY v.job_id
"""


def _incident_payload(member: Member, classification: str, episode_id, opened, sequence):
    return {
        "lostMemberUuid": str(member.uuid),
        "lostAddress": member.address,
        "classification": classification,
        "episodeId": episode_id,
        "episodeStarted": opened,
        "memberEventSequence": sequence,
    }


@dataclass
class MemberLossEvents:
    """The ``dirty.*`` events of one member event, appended by the caller once it holds the
    event-append lock (after its own ``member.*`` event): the lock is taken last, so waiting for
    a job's state row never happens while holding it (engine.events)."""

    member: Member
    sequence: int
    epoch: int | None
    classification: str
    incidents: list[tuple[int, int, bool]]  # (job id, episode id, episode opened)
    failures: list[EngineEvent]

    @property
    def registered(self) -> int:
        return len(self.incidents)

    def append(self) -> None:
        """Insert the events (set-based); the caller's transaction holds the append lock.
        Never raises: the tracked state is committed with the removal all the same."""
        try:
            with transaction.atomic():
                self._append()
        except Exception:
            log.exception("could not append the dirty.* events of member event %s", self.sequence)

    def _append(self) -> None:
        if self.incidents:
            with connection.cursor() as cur:
                cur.execute(
                    _INCIDENT_EVENTS,
                    {
                        "uuid": self.member.uuid,
                        "address": self.member.address,
                        "classification": self.classification,
                        "sequence": self.sequence,
                        "epoch": self.epoch,
                        "jobs": [i[0] for i in self.incidents],
                        "episodes": [i[1] for i in self.incidents],
                        "opened": [i[2] for i in self.incidents],
                    },
                )
        if self.failures:
            EngineEvent.objects.bulk_create(self.failures)


def on_member_lost(member: Member, sequence: int, epoch: int | None) -> MemberLossEvents:
    """Handle member event ``sequence`` (``member`` was REMOVED or LEFT) for every enabled job.

    Runs inside the transaction that ended the membership and bumped the sequence, before the
    master fails the member's task groups. A constant number of statements whatever the number
    of jobs; if the batch fails, each affected job is retried alone, so one bad job only makes
    itself UNKNOWN (a gap freezes its watermark). Never raises; the caller appends the returned
    events after its own.
    """
    classification = classify_leave(member)
    out = MemberLossEvents(member, sequence, epoch, classification, [], [])
    try:
        with transaction.atomic():
            out.incidents = _register_losses(member, sequence, classification, None)
            _advance_watermark(sequence)
            return out
    except Exception as exc:  # the batch failed: isolate the job(s) that cannot be tracked
        log.warning("batched member-loss tracking failed, retrying job by job: %s", exc)
        out.incidents = []
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                _LOCK_AFFECTED.format(only="", lock=""),  # only a scan: the batch rolled back
                {"member": member.id, "not_affected": _NOT_AFFECTED},
            )
            affected = [r[0] for r in cur.fetchall()]
    except Exception as exc:
        out.failures += _failed([], epoch, "member-loss scan", exc)
        return out  # the shared watermark stays behind: every enabled job reads UNKNOWN
    for job_id in affected:
        try:
            with transaction.atomic():
                out.incidents += _register_losses(member, sequence, classification, [job_id])
        except Exception as exc:
            out.failures += _failed([job_id], epoch, "member-loss incident", exc)
            if not _record_gap(job_id, str(exc), sequence=sequence):
                out.failures += _failed([], epoch, "tracking gap", exc)
                return out  # cannot record the gap: the shared watermark stays behind
    try:
        with transaction.atomic():
            _advance_watermark(sequence)
    except Exception as exc:
        out.failures += _failed([], epoch, "member-event watermark", exc)
    return out


def _advance_watermark(sequence: int) -> None:
    """Every job that has no gap has handled member event ``sequence``."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE engine_clusterstate SET dirty_handled_sequence = %s"
            " WHERE id = 1 AND dirty_handled_sequence = %s",
            [sequence, sequence - 1],
        )


def _register_losses(
    member: Member,
    sequence: int,
    classification: str,
    only: list[int] | None,
) -> list[tuple[int, int, bool]]:
    """Register ``member``'s loss for the affected enabled jobs (all, or ``only``); returns
    (job id, episode id, episode opened) of each job that got a new incident."""
    params = {
        "member": member.id,
        "not_affected": _NOT_AFFECTED,
        "uuid": member.uuid,
        "address": member.address,
        "classification": classification,
        "sequence": sequence,
        "only": only or [],
    }
    with connection.cursor() as cur:
        only_sql = "" if only is None else "AND s.job_id = ANY(%(only)s)"
        cur.execute(_LOCK_AFFECTED.format(only=only_sql, lock="FOR NO KEY UPDATE OF s"), params)
        jobs = [r[0] for r in cur.fetchall()]
        if not jobs:
            return []
        cur.execute(_MERGE, {**params, "jobs": jobs})
        return [tuple(row) for row in cur.fetchall()]


def _merge_incidents(
    member: Member, epoch: int | None, classification: str, job_id: int
) -> list[EngineEvent]:
    """Restore preparation's merge of a loss not registered yet (state row locked by the
    caller): the same statement, without touching the watermark; events returned."""
    with connection.cursor() as cur:
        cur.execute(
            _MERGE,
            {
                "jobs": [job_id],
                "uuid": member.uuid,
                "address": member.address,
                "classification": classification,
                "sequence": None,
            },
        )
        bound = cur.fetchall()
    return [
        _event("incident", j, epoch, **_incident_payload(member, classification, ep, op, None))
        for j, ep, op in bound
    ]


# -- restore preparation and deployment --------------------------------------------------------


def _lock_state(job_id: int) -> DirtyJobState | None:
    return DirtyJobState.objects.select_for_update(no_key=True).filter(job_id=job_id).first()


def _incomplete(state: DirtyJobState, epoch: int | None, reason: str) -> list[EngineEvent]:
    """Something happened that the tracker cannot explain: a permanent gap, so the job is
    UNKNOWN from now on."""
    log.warning("dirty-job tracking of job %s incomplete: %s", state.job_id, reason)
    _record_gap(state.job_id, reason)
    return [_event("tracking-incomplete", state.job_id, epoch, reason=reason)]


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
        return _contained(job, epoch, "restore preparation", exc, repairable=False)


def _prepare(job, pipeline, restore_number, lost_member_ids, epoch) -> list[EngineEvent]:
    state = _lock_state(job.id)
    if state is None:
        return []  # missing state: the job evaluates UNKNOWN already
    events: list[EngineEvent] = []
    if Attempt.objects.filter(pipeline=pipeline, restore_number=restore_number).exists():
        return []  # this restore was prepared before: a duplicate
    for member in Member.objects.filter(id__in=lost_member_ids).order_by("id"):
        events += _merge_incidents(member, epoch, classify_leave(member), job.id)
    state.refresh_from_db()
    if state.active_episode_id is None:
        # Member loss restored a pipeline, but every loss involved was already part of an
        # ended episode: bind to a new one so the attempt is not lost, and say we are unsure.
        episode = Episode.objects.create(job=job, classification=UNCLASSIFIED)
        DirtyJobState.objects.filter(job_id=job.id).update(
            active_episode=episode, recovery_episode_count=state.recovery_episode_count + 1
        )
        state.active_episode_id = episode.id
        events += _incomplete(
            state,
            epoch,
            f"restore {restore_number} of pipeline "
            f"{pipeline.index} without an active recovery episode",
        )
    episode_id = state.active_episode_id
    last = (
        Attempt.objects.filter(episode_id=episode_id, pipeline=pipeline)
        .order_by("-prepare_sequence")
        .values_list("prepare_sequence", flat=True)
        .first()
    )
    sequence = (last or 0) + 1
    attempt = Attempt.objects.create(
        attempt_id=f"{episode_id}-{pipeline.index}-{sequence}",
        job=job,
        episode_id=episode_id,
        pipeline=pipeline,
        prepare_sequence=sequence,
        restore_number=restore_number,
    )
    Episode.objects.filter(id=episode_id).update(last_activity_at=Now())
    events.append(
        _event(
            "attempt-prepared",
            job.id,
            epoch,
            attemptId=attempt.attempt_id,
            episodeId=episode_id,
            pipelineId=pipeline.index,
            prepareSequence=sequence,
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
            state = _lock_state(job.id)
            if state is None:
                return []
            attempt = Attempt.objects.filter(
                pipeline=pipeline, restore_number=restore_number
            ).first()
            if attempt is None:
                return _incomplete(
                    state,
                    epoch,
                    f"pipeline {pipeline.index} redeployed (restore {restore_number}) without a "
                    "prepared attempt",
                )
            return _confirm(state, attempt, epoch)
    except Exception as exc:  # the reconciliation confirms it from the pipeline's restore count
        return _contained(job, epoch, "attempt confirmation", exc, repairable=True)


def _confirm(state: DirtyJobState, attempt: Attempt, epoch: int | None) -> list[EngineEvent]:
    """PREPARED -> CONFIRMED; count if the episode's generation advances. Idempotent."""
    if attempt.state == Attempt.State.CONFIRMED:
        return []  # a duplicate confirmation
    if attempt.state != Attempt.State.PREPARED:
        return _incomplete(state, epoch, f"attempt {attempt.attempt_id} deployed after it ended")
    Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.CONFIRMED, ended_at=Now())
    episode = Episode.objects.select_for_update(no_key=True).get(id=attempt.episode_id)
    counted = attempt.prepare_sequence > episode.generation
    events: list[EngineEvent] = []
    fields: dict = {"updated_at": Now()}
    if counted:
        Episode.objects.filter(id=episode.id).update(
            generation=attempt.prepare_sequence, last_activity_at=Now()
        )
        state.recovery_attempt_count += attempt.prepare_sequence - episode.generation
        fields.update(recovery_attempt_count=state.recovery_attempt_count, last_counted_at=Now())
        if not state.dirty and state.recovery_attempt_count >= state.threshold:
            state.dirty = True
            fields.update(dirty=True, first_dirty_at=Now())
            events.append(
                _event(
                    "marked",
                    state.job_id,
                    epoch,
                    recoveryAttemptCount=state.recovery_attempt_count,
                    threshold=state.threshold,
                    attemptId=attempt.attempt_id,
                )
            )
    else:
        Episode.objects.filter(id=episode.id).update(last_activity_at=Now())
    DirtyJobState.objects.filter(job_id=state.job_id).update(**fields)
    events.insert(
        0,
        _event(
            "attempt-confirmed",
            state.job_id,
            epoch,
            attemptId=attempt.attempt_id,
            episodeId=episode.id,
            generation=max(episode.generation, attempt.prepare_sequence),
            counted=counted,
            recoveryAttemptCount=state.recovery_attempt_count,
        ),
    )
    return events


# -- episode end -----------------------------------------------------------------------------


def after_settle(job: Job, pipelines: list[Pipeline], epoch: int | None = None):
    """After a roll-up of a running job (job row locked): complete the active episode once every
    pipeline runs again, nothing prepared waits to deploy and no task group is left on a lost
    member. Never raises."""
    if job.dirty_threshold <= 0 or job.status in JOB_TERMINAL:
        return []
    if any(p.status not in (ES.RUNNING, ES.FINISHED) for p in pipelines):
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
            state = _lock_state(job.id)
            if state is None or state.active_episode_id is None:
                return []
            if not _recovered(job, state.active_episode_id):
                return []
            return _end_episode(
                state, state.active_episode_id, Episode.Status.COMPLETED, "recovered", epoch
            )
    except Exception as exc:  # the reconciliation completes it later
        return _contained(job, epoch, "episode completion", exc, repairable=True)


def _recovered(job: Job, episode_id: int) -> bool:
    states = set(Attempt.objects.filter(episode_id=episode_id).values_list("state", flat=True))
    if Attempt.State.CONFIRMED not in states or Attempt.State.PREPARED in states:
        return False
    return not (
        TaskGroup.objects.filter(job=job)
        .exclude(status__in=[*EXECUTION_TERMINAL, ES.CREATED])
        .exclude(member__state=MemberState.ALIVE)
        .exists()
    )


def _end_episode(
    state: DirtyJobState, episode_id: int, status: str, reason: str, epoch: int | None
) -> list[EngineEvent]:
    Episode.objects.filter(id=episode_id, status=Episode.Status.ACTIVE).update(
        status=status, ended_at=Now(), end_reason=reason[:1000]
    )
    Attempt.objects.filter(episode_id=episode_id, state=Attempt.State.PREPARED).update(
        state=Attempt.State.ABORTED, ended_at=Now()
    )
    DirtyJobState.objects.filter(job_id=state.job_id, active_episode_id=episode_id).update(
        active_episode=None, updated_at=Now()
    )
    state.active_episode_id = None
    _prune(state.job_id)
    kind = "episode-completed" if status == Episode.Status.COMPLETED else "episode-aborted"
    return [_event(kind, state.job_id, epoch, episodeId=episode_id, reason=reason)]


def _prune(job_id: int) -> None:
    """Keep the ``event-history-size`` most recent episodes of the job (incidents stay: they
    are the idempotency keys, one small row per member lost)."""
    keep = options().history_size
    old = list(
        Episode.objects.filter(job_id=job_id)
        .exclude(status=Episode.Status.ACTIVE)
        .order_by("-id")
        .values_list("id", flat=True)[keep:]
    )
    if old:
        Episode.objects.filter(id__in=old).delete()


def expire_stale_episodes(epoch: int) -> bool:
    """Active-master housekeeping: abort episodes idle for ``pending-incident-ttl`` that have no
    prepared restore still able to deploy (stale incidents that never reach deployment)."""

    cutoff = timezone.now() - timedelta(seconds=options().pending_incident_ttl)
    waiting = Attempt.objects.filter(
        episode_id=OuterRef("id"),
        state=Attempt.State.PREPARED,
        pipeline__status=ES.FAILING,
        pipeline__restore_count=F("restore_number") - 1,
        job__status__in=[JobStatus.SCHEDULED, JobStatus.RUNNING],
    )
    stale = list(
        Episode.objects.filter(status=Episode.Status.ACTIVE, last_activity_at__lt=cutoff)
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
        state = _lock_state(job_id)
        # Re-checked under the locks: a loss or a deployment may have renewed it meanwhile.
        episode = Episode.objects.filter(id=episode_id).first()
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
            _end_episode(
                state,
                episode_id,
                Episode.Status.ABORTED,
                "expired: no deployment within engine.dirty-task.pending-incident-ttl",
                epoch,
            )
        )
        return True


def _pending(job: Job, episode_id: int) -> bool:
    """A PREPARED attempt whose pipeline still waits for exactly that restore."""
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return False
    for attempt in Attempt.objects.filter(
        episode_id=episode_id, state=Attempt.State.PREPARED
    ).select_related("pipeline"):
        p = attempt.pipeline
        if p.status == ES.FAILING and p.restore_count == attempt.restore_number - 1:
            return True
    return False


def on_restore_obsolete(job: Job, pipeline: Pipeline, restore_number: int, epoch: int | None):
    """A restore step found nothing to do (its job is stopping, or the pipeline moved on): its
    attempt, if the pipeline never got that deployment, will never deploy. Never raises."""
    if job.dirty_threshold <= 0 or pipeline.restore_count >= restore_number:
        return []
    try:
        with transaction.atomic():
            if _lock_state(job.id) is None:
                return []
            ended = Attempt.objects.filter(
                pipeline=pipeline, restore_number=restore_number, state=Attempt.State.PREPARED
            ).update(state=Attempt.State.ABORTED, ended_at=Now())
            if not ended:
                return []
            return [
                _event(
                    "attempt-aborted",
                    job.id,
                    epoch,
                    pipelineId=pipeline.index,
                    restore=restore_number,
                    reason="restore obsolete",
                )
            ]
    except Exception as exc:
        return _contained(job, epoch, "obsolete restore", exc, repairable=True)


# -- active-master change and repair ---------------------------------------------------------


def reconcile(epoch: int) -> int:
    """The active master's reconciliation: once per epoch before it schedules anything, then as
    housekeeping. Explains every PREPARED attempt of a job by its pipeline's state; returns how
    many attempts changed state.

    - the pipeline got the deployment of that restore (its restore count reached it): confirm
      the original attempt id (a no-op if it was confirmed), whatever happened since;
    - it still waits for that restore: keep the binding, normal deployment confirms it;
    - it ended without that deployment: abort the attempt;
    - anything else is unexplained: the job becomes UNKNOWN.
    Then it completes episodes whose recovery finished unnoticed, removes repairable gaps that
    are repaired, finishes terminal snapshots that failed, and turns a member event the tracker
    could not handle at all into gaps of the jobs it concerned. One job's failure is contained
    (and recorded); only a stale epoch stops it.
    """
    changed = 0
    prepared = list(
        Attempt.objects.filter(state=Attempt.State.PREPARED)
        .exclude(job__status__in=JOB_TERMINAL)
        .order_by("job_id", "id")
        .values_list("id", "job_id")
    )
    for attempt_id, job_id in prepared:
        changed += _per_job(epoch, job_id, "reconciliation", _reconcile_attempt, attempt_id)
    for job_id in (
        Episode.objects.filter(status=Episode.Status.ACTIVE)
        .exclude(job__status__in=JOB_TERMINAL)
        .order_by("job_id")
        .values_list("job_id", flat=True)
    ):
        _per_job(epoch, job_id, "episode completion", _complete_if_recovered)
    for job_id in sorted(
        set(DirtyTrackingGap.objects.filter(repairable=True).values_list("job_id", flat=True))
    ):
        _per_job(epoch, job_id, "gap repair", _repair_gaps)
    for job_id in (
        DirtyJobState.objects.filter(job__status__in=JOB_TERMINAL)
        .order_by("job_id")
        .values_list("job_id", flat=True)
    ):
        _per_job(epoch, job_id, "terminal snapshot", _finish_terminal)
    try:
        _repair_watermark(epoch)
    except StaleEpoch:
        raise
    except Exception:
        log.exception("dirty-job watermark repair failed; it is retried")
    return changed


def _per_job(epoch: int, job_id: int, where: str, step, *args) -> int:
    """Run ``step(job, epoch, *args)`` in one fenced transaction with the job row locked; a
    failure is logged, recorded as a gap and skipped (a stale epoch propagates)."""

    try:
        with fenced(epoch):
            job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
            if job is None:
                return 0
            changed, events = step(job, epoch, *args)
            append_events(events)
            return changed
    except StaleEpoch:
        raise
    except Exception as exc:
        log.exception("dirty-job %s of job %s failed", where, job_id)
        _record_gap(job_id, f"{where} failed: {exc}", repairable=True)
        return 0


def _reconcile_attempt(job: Job, epoch: int, attempt_id: int):
    state = _lock_state(job.id)
    attempt = Attempt.objects.select_related("pipeline").filter(id=attempt_id).first()
    if state is None or attempt is None or attempt.state != Attempt.State.PREPARED:
        return 0, []
    p = attempt.pipeline
    if p.restore_count >= attempt.restore_number:
        return 1, _confirm(state, attempt, epoch)
    if p.status == ES.FAILING and p.restore_count == attempt.restore_number - 1:
        return 0, []
    if p.status in EXECUTION_TERMINAL or job.status in JOB_TERMINAL:
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.ABORTED, ended_at=Now())
        return 1, [_event("attempt-aborted", job.id, epoch, attemptId=attempt.attempt_id)]
    return 1, _incomplete(
        state,
        epoch,
        f"attempt {attempt.attempt_id} is PREPARED but pipeline {p.index} is {p.status} after "
        f"{p.restore_count} restore(s)",
    )


def _complete_if_recovered(job: Job, epoch: int):
    return 0, after_settle(job, list(job.pipelines.order_by("index")), epoch)


def _repair_gaps(job: Job, epoch: int):
    """Repairable gaps go once nothing is left to redo: every attempt whose deployment happened
    is confirmed, and a recovered episode is completed (both done just before, in order)."""
    if job.status not in JOB_TERMINAL:
        unconfirmed = Attempt.objects.filter(
            job=job,
            state=Attempt.State.PREPARED,
            pipeline__restore_count__gte=F("restore_number"),
        ).exists()
        if unconfirmed:
            return 0, []
        _, events = _complete_if_recovered(job, epoch)
    else:
        events = []
    removed, _ = DirtyTrackingGap.objects.filter(job=job, repairable=True).delete()
    if removed:
        events.append(_event("repaired", job.id, epoch, gaps=removed))
    return removed, events


def _finish_terminal(job: Job, epoch: int):
    """A terminal job whose snapshot failed keeps its running state: snapshot it now."""
    if job.status not in JOB_TERMINAL:
        return 0, []
    return 1, on_job_terminal(job, epoch, strict=True)


def _repair_watermark(epoch: int) -> None:
    """A member event the tracker could not handle at all (not even a gap could be written, or
    a member of an older protocol ended it) leaves the shared watermark behind, which would keep
    every job UNKNOWN for ever, even jobs submitted later. Turn it into permanent gaps of the
    jobs tracked now (a superset of those it concerned) and catch the watermark up."""

    with fenced(epoch):
        row = (
            ClusterState.objects.select_for_update(no_key=True)
            .filter(id=1)
            .values_list("member_event_sequence", "dirty_handled_sequence")
            .first()
        )
        if row is None or row[1] >= row[0]:
            return
        sequence, handled = row
        with connection.cursor() as cur:
            cur.execute(
                """
                INSERT INTO engine_dirtytrackinggap
                       (job_id, member_event_sequence, repairable, reason, at)
                SELECT job_id, %s, false, %s, now() FROM engine_dirtyjobstate
                """,
                [handled + 1, f"member events {handled + 1}..{sequence} were not handled"],
            )
            gaps = cur.rowcount
        ClusterState.objects.filter(id=1).update(dirty_handled_sequence=sequence)
        log.error(
            "dirty-job tracking missed member events %s..%s: %s jobs are UNKNOWN from now on",
            handled + 1,
            sequence,
            gaps,
        )
        append_events(
            [
                EngineEvent(
                    kind="dirty.tracker-failed",
                    epoch=epoch,
                    payload={
                        "where": "member-event watermark",
                        "error": f"member events {handled + 1}..{sequence} were not handled",
                        "jobs": gaps,
                    },
                )
            ]
        )


# -- the end of a job ------------------------------------------------------------------------


def on_job_terminal(job: Job, epoch: int | None = None, strict: bool = False):
    """The job just became terminal (its row locked): abort the active episode, snapshot the
    summary and recent episodes into history, and only then remove the running state.

    If the snapshot cannot be written, the running state is kept (DIRTY is never lost) and the
    reconciliation snapshots it later; the job's end is never blocked (``strict``: raise, for
    the reconciliation's own containment)."""
    from history.models import JobHistory

    events: list[EngineEvent] = []
    try:
        with transaction.atomic():
            snapshot, episodes = None, []
            if job.dirty_threshold > 0:
                state = _lock_state(job.id)
                if state is not None and state.active_episode_id is not None:
                    events += _end_episode(
                        state,
                        state.active_episode_id,
                        Episode.Status.ABORTED,
                        f"job {job.status}",
                        epoch,
                    )
                snapshot = summary(job, state, Sequences.read(job.id))
                episodes = episode_list(job.id)
            JobHistory.objects.update_or_create(
                job=job,
                defaults={"status": job.status, "dirty_task": snapshot, "episodes": episodes},
            )
            if job.dirty_threshold > 0:
                Attempt.objects.filter(job=job).delete()
                Episode.objects.filter(job=job).delete()
                MemberLossIncident.objects.filter(job=job).delete()
                DirtyTrackingGap.objects.filter(job=job).delete()
                DirtyJobState.objects.filter(job=job).delete()
                events.append(_event("snapshot", job.id, epoch, **_short(snapshot)))
            return events
    except Exception as exc:
        if strict:
            raise
        return _failed([job.id], epoch, "history snapshot", exc)


def _short(snapshot: dict | None) -> dict:
    snapshot = snapshot or {}
    return {k: snapshot.get(k) for k in ("dirty", "evaluationStatus", "recoveryAttemptCount")}


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sequences:
    """What a job's tracking is judged by: the global member-event sequence, the shared
    watermark, and the job's gaps (DirtyTrackingGap): the first member event it could not
    handle, and why it is incomplete, if it is."""

    member_event: int
    handled: int
    gap: int | None = None
    gap_reason: str | None = None

    @classmethod
    def read(cls, job_id: int) -> Sequences:
        row = ClusterState.objects.filter(id=1).values_list(
            "member_event_sequence", "dirty_handled_sequence"
        ).first() or (0, 0)
        gaps = list(
            DirtyTrackingGap.objects.filter(job_id=job_id)
            .order_by("id")
            .values_list("member_event_sequence", "reason")
        )
        missed = [g for g, _ in gaps if g is not None]
        return cls(row[0], row[1], min(missed) if missed else None, gaps[0][1] if gaps else None)

    @property
    def watermark(self) -> int:
        """The last member event the job handled."""
        return self.handled if self.gap is None else min(self.handled, self.gap - 1)

    @property
    def lagging(self) -> bool:
        return self.watermark < self.member_event

    @property
    def complete(self) -> bool:
        return not self.lagging and self.gap_reason is None


def evaluate(state: DirtyJobState | None, sequences: Sequences) -> str:
    """CLEAN only when tracking is complete and up to date; DIRTY is irreversible."""
    if state is None or state.schema_version > SCHEMA_VERSION:
        return UNKNOWN
    if state.dirty:
        return DIRTY
    if not sequences.complete:
        return UNKNOWN
    return CLEAN


def _millis(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


DISABLED_SUMMARY = {"evaluationStatus": DISABLED, "dirty": False}


def missing_summary(job: Job, reason: str) -> dict:
    return {
        "dirty": False,
        "evaluationStatus": UNKNOWN,
        "trackingComplete": False,
        "threshold": job.dirty_threshold,
        "recoveryAttemptCount": 0,
        "recoveryEpisodeCount": 0,
        "memberLossIncidentCount": 0,
        "activeEpisodeId": None,
        "lastLeaveClassification": None,
        "lastLostMemberUuid": None,
        "lastLostAddress": None,
        "lastCountedTime": None,
        "firstDirtyTime": None,
        "incompleteReason": reason,
    }


def summary(job: Job, state: DirtyJobState | None, sequences: Sequences) -> dict:
    """The ``dirtyTask`` object of a running job (and, frozen, of a finished one)."""
    if job.dirty_threshold <= 0:
        return dict(DISABLED_SUMMARY)
    if state is None:
        return missing_summary(job, "no dirty-job state exists for this job")
    evaluation = evaluate(state, sequences)
    lagging = sequences.lagging
    reason = sequences.gap_reason
    if lagging:
        reason = (
            f"member event {sequences.watermark + 1} of {sequences.member_event} was not "
            "handled for this job"
        )
    if state.schema_version > SCHEMA_VERSION:
        reason = f"dirty state layout {state.schema_version} is newer than this engine's"
    return {
        "dirty": evaluation == DIRTY,
        "evaluationStatus": evaluation,
        "trackingComplete": sequences.complete and state.schema_version <= SCHEMA_VERSION,
        "threshold": state.threshold,
        "recoveryAttemptCount": state.recovery_attempt_count,
        "recoveryEpisodeCount": state.recovery_episode_count,
        "memberLossIncidentCount": state.member_loss_incident_count,
        "activeEpisodeId": state.active_episode_id,
        "lastLeaveClassification": state.last_leave_classification or None,
        "lastLostMemberUuid": str(state.last_lost_member_uuid)
        if state.last_lost_member_uuid
        else None,
        "lastLostAddress": state.last_lost_address or None,
        "lastCountedTime": _millis(state.last_counted_at),
        "firstDirtyTime": _millis(state.first_dirty_at),
        "incompleteReason": reason or None,
    }


def job_summary(job: Job) -> dict:
    """``dirtyTask`` of any job: running from its state, finished from its history record. A
    finished job whose snapshot is still to be written reads from its running state; an old
    record without a summary (or no record at all) reads as DISABLED."""
    state = None
    if job.status in JOB_TERMINAL:
        from history.models import JobHistory

        snapshot = (
            JobHistory.objects.filter(job_id=job.id).values_list("dirty_task", flat=True).first()
        )
        if snapshot:
            return snapshot
        state = DirtyJobState.objects.filter(job_id=job.id).first()
        if state is None:
            return dict(DISABLED_SUMMARY)
    if job.dirty_threshold <= 0:
        return dict(DISABLED_SUMMARY)
    state = state or DirtyJobState.objects.filter(job_id=job.id).first()
    return summary(job, state, Sequences.read(job.id))


def episode_list(job_id: int) -> list[dict]:
    """The bounded recent episodes of a job, newest first (the episodes endpoint's shape)."""
    episodes = list(Episode.objects.filter(job_id=job_id).order_by("-id")[: options().history_size])
    ids = [e.id for e in episodes]
    incidents: dict[int, list] = {i: [] for i in ids}
    for incident in MemberLossIncident.objects.filter(episode_id__in=ids).order_by("id"):
        incidents[incident.episode_id].append(
            {
                "lostMemberUuid": str(incident.lost_member_uuid),
                "lostAddress": incident.lost_address,
                "classification": incident.classification,
                "at": incident.at.isoformat(),
            }
        )
    attempts: dict[int, list] = {i: [] for i in ids}
    for attempt in (
        Attempt.objects.filter(episode_id__in=ids).select_related("pipeline").order_by("id")
    ):
        attempts[attempt.episode_id].append(
            {
                "attemptId": attempt.attempt_id,
                "pipelineId": attempt.pipeline.index,
                "prepareSequence": attempt.prepare_sequence,
                "state": attempt.state,
                "at": (attempt.ended_at or attempt.prepared_at).isoformat(),
            }
        )
    return [
        {
            "episodeId": e.id,
            "status": e.status,
            "startedAt": e.started_at.isoformat(),
            "endedAt": e.ended_at.isoformat() if e.ended_at else None,
            "generation": e.generation,
            "classification": e.classification,
            "endReason": e.end_reason or None,
            "incidents": incidents[e.id],
            "attempts": attempts[e.id],
        }
        for e in episodes
    ]


def job_episodes(job: Job) -> list[dict]:
    if job.status in JOB_TERMINAL:
        from history.models import JobHistory

        return (
            JobHistory.objects.filter(job_id=job.id).values_list("episodes", flat=True).first()
            or []
        )
    return episode_list(job.id)


def annotate(queryset):
    """Annotate jobs with ``dirty_evaluation`` and ``dirty_attempts`` in SQL, by the rules of
    ``job_summary`` and ``evaluate`` (for lists and the ``?dirty=`` / ``?evaluationStatus=``
    filters)."""
    behind = Exists(
        ClusterState.objects.filter(id=1, dirty_handled_sequence__lt=F("member_event_sequence"))
    )
    gap = Exists(DirtyTrackingGap.objects.filter(job_id=OuterRef("id")))
    history_status = KeyTextTransform("evaluationStatus", "history__dirty_task")
    terminal = Q(status__in=JOB_TERMINAL)
    return queryset.annotate(
        dirty_evaluation=Case(
            When(terminal & Q(history__dirty_task__isnull=False), then=history_status),
            When(terminal & Q(dirty_state__isnull=True), then=Value(DISABLED)),
            When(dirty_threshold__lte=0, then=Value(DISABLED)),
            When(dirty_state__isnull=True, then=Value(UNKNOWN)),
            When(dirty_state__schema_version__gt=SCHEMA_VERSION, then=Value(UNKNOWN)),
            When(dirty_state__dirty=True, then=Value(DIRTY)),
            When(gap, then=Value(UNKNOWN)),
            When(behind, then=Value(UNKNOWN)),
            default=Value(CLEAN),
            output_field=CharField(),
        ),
        dirty_attempts=Coalesce(
            Cast(KeyTextTransform("recoveryAttemptCount", "history__dirty_task"), IntegerField()),
            "dirty_state__recovery_attempt_count",
            output_field=IntegerField(),
        ),
    )


def list_summary(evaluation: str, attempts: int | None) -> dict:
    if evaluation == DISABLED:
        return dict(DISABLED_SUMMARY)
    return {
        "dirty": evaluation == DIRTY,
        "evaluationStatus": evaluation,
        "recoveryAttemptCount": attempts or 0,
    }


def dirty_filter(value: bool) -> Q:
    return Q(dirty_evaluation=DIRTY) if value else ~Q(dirty_evaluation=DIRTY)


# -- mixed versions --------------------------------------------------------------------------


def older_members() -> list[str]:
    """Alive members and masters that run a protocol older than dirty tracking needs."""
    from .models import MasterCandidate
    from .protocol import DIRTY_TRACKING_SINCE
    from .states import CandidateState

    members = [
        f"member {name} ({uuid}) runs protocol {version}"
        for name, uuid, version in Member.objects.filter(
            state=MemberState.ALIVE, protocol_version__lt=DIRTY_TRACKING_SINCE
        )
        .order_by("name")
        .values_list("name", "uuid", "protocol_version")
    ]
    fresh = timezone.now() - timedelta(seconds=max(settings.ENGINE["heartbeat-timeout"], 5))
    masters = [
        f"master {name} runs protocol {version}"
        for name, version in MasterCandidate.objects.filter(
            state__in=[CandidateState.ACTIVE, CandidateState.STANDBY],
            last_seen__gte=fresh,
            protocol_version__lt=DIRTY_TRACKING_SINCE,
        )
        .order_by("name")
        .values_list("name", "protocol_version")
    ]
    return members + masters
