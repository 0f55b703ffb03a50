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
global member-event sequence is bumped before the jobs are scanned; each job's watermark moves
only from ``sequence - 1`` to ``sequence`` after the job handled the event, in one statement for
all jobs. A job that missed an event (its update failed) stays behind for ever: UNKNOWN, never
CLEAN. Tracker failures are caught in savepoints, logged and recorded as ``dirty.tracker-failed``
events: they never block the member removal, the restore or the job's end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, CharField, IntegerField, Q, Subquery, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Now
from django.utils import timezone

from .models import (
    ClusterState,
    DirtyJobState,
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
    """Log and surface a tracker failure (the caller's savepoint rolled its writes back)."""
    log.error("dirty-job tracking failed (%s) for jobs %s: %s", where, list(job_ids), exc)
    return [_event("tracker-failed", j, epoch, where=where, error=str(exc)[:500]) for j in job_ids]


# -- submission ------------------------------------------------------------------------------


def init_state(job: Job) -> None:
    """Create the state of an enabled job, in its submit transaction (before it is schedulable).

    The watermark starts at the current member-event sequence, read under a share lock: a member
    event being handled right now either committed before (we start after it) or waits for our
    commit and then sees this row.
    """
    if job.dirty_threshold <= 0:
        return
    with connection.cursor() as cur:
        cur.execute("SELECT member_event_sequence FROM engine_clusterstate WHERE id = 1 FOR SHARE")
        row = cur.fetchone()
    DirtyJobState.objects.create(
        job=job,
        threshold=job.dirty_threshold,
        processed_member_event_sequence=row[0] if row else 0,
    )


# -- member loss -----------------------------------------------------------------------------

_AFFECTED_SQL = """
    SELECT s.job_id, s.active_episode_id
      FROM engine_dirtyjobstate s
     WHERE s.job_id IN (SELECT DISTINCT t.job_id FROM engine_taskgroup t
                         WHERE t.member_id = %s AND t.status <> ALL(%s))
       {only}
     ORDER BY s.job_id
       FOR UPDATE OF s
"""


def on_member_lost(member: Member, sequence: int, epoch: int | None) -> list[EngineEvent]:
    """Handle member event ``sequence`` (``member`` was REMOVED or LEFT) for every enabled job.

    Runs inside the transaction that ended the membership and bumped the sequence, before the
    master fails the member's task groups. A constant number of statements whatever the number
    of jobs; if the batch fails, each affected job is retried alone, so one bad job only makes
    itself UNKNOWN. Never raises.
    """
    classification = classify_leave(member)
    try:
        with transaction.atomic():
            return _register_losses(member, sequence, epoch, classification, None)
    except Exception as exc:  # the batch failed: isolate the job(s) that cannot be tracked
        log.warning("batched member-loss tracking failed, retrying job by job: %s", exc)
    events: list[EngineEvent] = []
    failed: list[int] = []
    try:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT DISTINCT t.job_id FROM engine_taskgroup t JOIN engine_dirtyjobstate s"
                " ON s.job_id = t.job_id WHERE t.member_id = %s AND t.status <> ALL(%s)"
                " ORDER BY 1",
                [member.id, _NOT_AFFECTED],
            )
            affected = [r[0] for r in cur.fetchall()]
    except Exception as exc:
        return _failed([], epoch, "member-loss scan", exc)
    for job_id in affected:
        try:
            with transaction.atomic():
                events += _register_losses(member, sequence, epoch, classification, [job_id])
        except Exception as exc:
            failed.append(job_id)
            events += _failed([job_id], epoch, "member-loss incident", exc)
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                "UPDATE engine_dirtyjobstate SET processed_member_event_sequence = %s"
                " WHERE processed_member_event_sequence = %s AND job_id <> ALL(%s)",
                [sequence, sequence - 1, failed + affected],
            )
    except Exception as exc:
        events += _failed([], epoch, "member-event watermark", exc)
    return events


_NOT_AFFECTED = [*sorted(EXECUTION_TERMINAL), ES.CREATED]


def _register_losses(
    member: Member,
    sequence: int,
    epoch: int | None,
    classification: str,
    only: list[int] | None,
) -> list[EngineEvent]:
    """Register ``member``'s loss for the affected enabled jobs (all, or ``only``) and, for all
    jobs at once (only when ``only`` is None), advance the watermark."""
    with connection.cursor() as cur:
        cur.execute(
            _AFFECTED_SQL.format(only="AND s.job_id = ANY(%s)" if only is not None else ""),
            [member.id, _NOT_AFFECTED] + ([only] if only is not None else []),
        )
        locked = dict(cur.fetchall())
        events: list[EngineEvent] = []
        if locked:
            events = _merge_incidents(cur, member, sequence, epoch, classification, locked)
        if only is None:
            cur.execute(
                "UPDATE engine_dirtyjobstate SET processed_member_event_sequence = %s"
                " WHERE processed_member_event_sequence = %s",
                [sequence, sequence - 1],
            )
        else:
            cur.execute(
                "UPDATE engine_dirtyjobstate SET processed_member_event_sequence = %s"
                " WHERE processed_member_event_sequence = %s AND job_id = ANY(%s)",
                [sequence, sequence - 1, only],
            )
    return events


def _merge_incidents(
    cur,
    member: Member,
    sequence: int | None,
    epoch: int | None,
    classification: str,
    locked: dict[int, int | None],
) -> list[EngineEvent]:
    """Insert the incidents (duplicates are no-ops), open episodes where none is active, bind,
    and count, for the locked states ``{job id: active episode id}``; set-based."""
    job_ids = sorted(locked)
    cur.execute(
        """
        INSERT INTO engine_memberlossincident
               (job_id, lost_member_uuid, lost_address, classification, member_event_sequence, at)
        SELECT j, %s, %s, %s, %s, now() FROM unnest(%s::bigint[]) AS j
        ON CONFLICT (job_id, lost_member_uuid) DO NOTHING
        RETURNING id, job_id
        """,
        [member.uuid, member.address, classification, sequence, job_ids],
    )
    new = {job_id: incident_id for incident_id, job_id in cur.fetchall()}
    if not new:
        return []  # a duplicate delivery: every incident exists already
    opening = sorted(j for j in new if locked[j] is None)
    episodes = {j: locked[j] for j in new if locked[j] is not None}
    if opening:
        cur.execute(
            """
            INSERT INTO engine_recoveryepisode
                   (job_id, status, classification, generation, started_at, last_activity_at,
                    end_reason)
            SELECT j, 'ACTIVE', %s, 0, now(), now(), '' FROM unnest(%s::bigint[]) AS j
            RETURNING id, job_id
            """,
            [classification, opening],
        )
        episodes.update({job_id: episode_id for episode_id, job_id in cur.fetchall()})
    continuing = [locked[j] for j in new if locked[j] is not None]
    if continuing:
        # An UNCLASSIFIED incident makes its whole episode count (seed: only an episode of
        # PLANNED_VERIFIED incidents alone may be excluded).
        cur.execute(
            """
            UPDATE engine_recoveryepisode
               SET last_activity_at = now(),
                   classification = CASE WHEN %s = 'UNCLASSIFIED' THEN 'UNCLASSIFIED'
                                         ELSE classification END
             WHERE id = ANY(%s)
            """,
            [classification, continuing],
        )
    jobs = sorted(new)
    cur.execute(
        """
        UPDATE engine_memberlossincident i SET episode_id = v.episode
          FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, episode) WHERE i.id = v.id
        """,
        [[new[j] for j in jobs], [episodes[j] for j in jobs]],
    )
    cur.execute(
        """
        UPDATE engine_dirtyjobstate s
           SET member_loss_incident_count = s.member_loss_incident_count + 1,
               recovery_episode_count = s.recovery_episode_count + v.opened,
               active_episode_id = v.episode,
               last_leave_classification = %s,
               last_lost_member_uuid = %s,
               last_lost_address = %s,
               updated_at = now()
          FROM unnest(%s::bigint[], %s::bigint[], %s::int[]) AS v(job_id, episode, opened)
         WHERE s.job_id = v.job_id
        """,
        [
            classification,
            member.uuid,
            member.address,
            jobs,
            [episodes[j] for j in jobs],
            [1 if locked[j] is None else 0 for j in jobs],
        ],
    )
    return [
        _event(
            "incident",
            j,
            epoch,
            lostMemberUuid=str(member.uuid),
            lostAddress=member.address,
            classification=classification,
            episodeId=episodes[j],
            episodeStarted=locked[j] is None,
            memberEventSequence=sequence,
        )
        for j in jobs
    ]


# -- restore preparation and deployment --------------------------------------------------------


def _lock_state(job_id: int) -> DirtyJobState | None:
    return DirtyJobState.objects.select_for_update().filter(job_id=job_id).first()


def _incomplete(state: DirtyJobState, epoch: int | None, reason: str) -> list[EngineEvent]:
    """Something happened that the tracker cannot explain: the job is UNKNOWN from now on."""
    log.warning("dirty-job tracking of job %s incomplete: %s", state.job_id, reason)
    if state.tracking_complete:
        DirtyJobState.objects.filter(job_id=state.job_id).update(
            tracking_complete=False, incomplete_reason=reason[:1000], updated_at=Now()
        )
        state.tracking_complete = False
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
    except Exception as exc:
        return _failed([job.id], epoch, "restore preparation", exc)


def _prepare(job, pipeline, restore_number, lost_member_ids, epoch) -> list[EngineEvent]:
    state = _lock_state(job.id)
    if state is None:
        return []  # missing state: the job evaluates UNKNOWN already
    events: list[EngineEvent] = []
    if Attempt.objects.filter(pipeline=pipeline, restore_number=restore_number).exists():
        return []  # this restore was prepared before: a duplicate
    with connection.cursor() as cur:
        for member in Member.objects.filter(id__in=lost_member_ids).order_by("id"):
            events += _merge_incidents(
                cur, member, None, epoch, classify_leave(member), {job.id: state.active_episode_id}
            )
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
    except Exception as exc:
        return _failed([job.id], epoch, "attempt confirmation", exc)


def _confirm(state: DirtyJobState, attempt: Attempt, epoch: int | None) -> list[EngineEvent]:
    """PREPARED -> CONFIRMED; count if the episode's generation advances. Idempotent."""
    if attempt.state == Attempt.State.CONFIRMED:
        return []  # a duplicate confirmation
    if attempt.state != Attempt.State.PREPARED:
        return _incomplete(state, epoch, f"attempt {attempt.attempt_id} deployed after it ended")
    Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.CONFIRMED, ended_at=Now())
    episode = Episode.objects.select_for_update().get(id=attempt.episode_id)
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
            if episode_id is None or not _recovered(job, episode_id):
                return []
            state = _lock_state(job.id)
            if state is None or state.active_episode_id != episode_id:
                return []
            return _end_episode(state, episode_id, Episode.Status.COMPLETED, "recovered", epoch)
    except Exception as exc:
        return _failed([job.id], epoch, "episode completion", exc)


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
    from .fencing import fenced

    cutoff = timezone.now() - timedelta(seconds=options().pending_incident_ttl)
    stale = list(
        Episode.objects.filter(status=Episode.Status.ACTIVE, last_activity_at__lt=cutoff)
        .order_by("job_id")
        .values_list("id", "job_id")[:100]
    )
    did = False
    for episode_id, job_id in stale:
        with fenced(epoch):
            job = Job.objects.select_for_update().get(id=job_id)
            state = _lock_state(job_id)
            if state is None or state.active_episode_id != episode_id or _pending(job, episode_id):
                continue
            events = _end_episode(
                state,
                episode_id,
                Episode.Status.ABORTED,
                "expired: no deployment within engine.dirty-task.pending-incident-ttl",
                epoch,
            )
            from .events import append_events

            append_events(events)
            did = True
    return did


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


# -- active-master change --------------------------------------------------------------------


def reconcile(epoch: int) -> int:
    """A new active master, before it schedules any restore: explain every PREPARED attempt of
    a running job by its pipeline's state. Returns how many attempts changed state.

    - the pipeline was redeployed for that restore (restore count reached it; DEPLOYING or
      RUNNING): confirm the original attempt id (a no-op if it was confirmed);
    - it still waits for that restore: keep the binding, normal deployment confirms it;
    - it ended: abort the attempt;
    - anything else is unexplained: the job becomes UNKNOWN.
    Episodes whose recovery finished unnoticed are completed.
    """
    from .events import append_events
    from .fencing import fenced

    changed = 0
    prepared = list(
        Attempt.objects.filter(state=Attempt.State.PREPARED)
        .exclude(job__status__in=JOB_TERMINAL)
        .order_by("job_id", "id")
        .values_list("id", "job_id")
    )
    for attempt_id, job_id in prepared:
        with fenced(epoch):
            Job.objects.select_for_update().get(id=job_id)
            state = _lock_state(job_id)
            attempt = Attempt.objects.select_related("pipeline").get(id=attempt_id)
            if state is None or attempt.state != Attempt.State.PREPARED:
                continue
            p = attempt.pipeline
            if p.restore_count >= attempt.restore_number and p.status in (
                ES.DEPLOYING,
                ES.RUNNING,
                ES.FAILING,
                ES.FINISHED,
            ):
                events = _confirm(state, attempt, epoch)
            elif p.status == ES.FAILING and p.restore_count == attempt.restore_number - 1:
                continue
            elif p.status in EXECUTION_TERMINAL:
                Attempt.objects.filter(id=attempt.id).update(
                    state=Attempt.State.ABORTED, ended_at=Now()
                )
                events = [_event("attempt-aborted", job_id, epoch, attemptId=attempt.attempt_id)]
            else:
                events = _incomplete(
                    state,
                    epoch,
                    f"attempt {attempt.attempt_id} is PREPARED but pipeline {p.index} is "
                    f"{p.status} after {p.restore_count} restore(s)",
                )
            append_events(events)
            changed += 1
    for job_id in (
        Episode.objects.filter(status=Episode.Status.ACTIVE)
        .exclude(job__status__in=JOB_TERMINAL)
        .order_by("job_id")
        .values_list("job_id", flat=True)
    ):
        with fenced(epoch):
            job = Job.objects.select_for_update().get(id=job_id)
            append_events(after_settle(job, list(job.pipelines.order_by("index")), epoch))
    return changed


# -- the end of a job ------------------------------------------------------------------------


def on_job_terminal(job: Job, epoch: int | None = None) -> list[EngineEvent]:
    """The job just became terminal (its row locked): abort the active episode, snapshot the
    summary and recent episodes into history, and only then remove the running state."""
    from history.models import JobHistory

    snapshot, episodes, events = None, [], []
    if job.dirty_threshold > 0:
        try:
            with transaction.atomic():
                state = _lock_state(job.id)
                if state is not None and state.active_episode_id is not None:
                    events += _end_episode(
                        state,
                        state.active_episode_id,
                        Episode.Status.ABORTED,
                        f"job {job.status}",
                        epoch,
                    )
                snapshot = summary(job, state, global_sequence())
                episodes = episode_list(job.id)
        except Exception as exc:
            events += _failed([job.id], epoch, "history snapshot", exc)
            snapshot = missing_summary(job, "the history snapshot failed")
    JobHistory.objects.update_or_create(
        job=job, defaults={"status": job.status, "dirty_task": snapshot, "episodes": episodes}
    )
    if job.dirty_threshold > 0:
        Attempt.objects.filter(job=job).delete()
        Episode.objects.filter(job=job).delete()
        MemberLossIncident.objects.filter(job=job).delete()
        DirtyJobState.objects.filter(job=job).delete()
        events.append(_event("snapshot", job.id, epoch, **_short(snapshot)))
    return events


def _short(snapshot: dict | None) -> dict:
    snapshot = snapshot or {}
    return {k: snapshot.get(k) for k in ("dirty", "evaluationStatus", "recoveryAttemptCount")}


# -- reading ---------------------------------------------------------------------------------


def global_sequence() -> int:
    return (
        ClusterState.objects.filter(id=1).values_list("member_event_sequence", flat=True).first()
        or 0
    )


def evaluate(state: DirtyJobState | None, sequence: int) -> str:
    """CLEAN only when tracking is complete and up to date; DIRTY is irreversible."""
    if state is None or state.schema_version > SCHEMA_VERSION:
        return UNKNOWN
    if state.dirty:
        return DIRTY
    if not state.tracking_complete or state.processed_member_event_sequence < sequence:
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


def summary(job: Job, state: DirtyJobState | None, sequence: int) -> dict:
    """The ``dirtyTask`` object of a running job (and, frozen, of a finished one)."""
    if job.dirty_threshold <= 0:
        return dict(DISABLED_SUMMARY)
    if state is None:
        return missing_summary(job, "no dirty-job state exists for this job")
    evaluation = evaluate(state, sequence)
    lagging = state.processed_member_event_sequence < sequence
    reason = state.incomplete_reason
    if lagging:
        reason = (
            f"member event {state.processed_member_event_sequence + 1} of {sequence} was not "
            "handled for this job"
        )
    if state.schema_version > SCHEMA_VERSION:
        reason = f"dirty state layout {state.schema_version} is newer than this engine's"
    return {
        "dirty": state.dirty,
        "evaluationStatus": evaluation,
        "trackingComplete": state.tracking_complete
        and not lagging
        and state.schema_version <= SCHEMA_VERSION,
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
    """``dirtyTask`` of any job: running from its state, finished from its history record (an
    old record without one reads as DISABLED)."""
    if job.status in JOB_TERMINAL:
        from history.models import JobHistory

        record = JobHistory.objects.filter(job_id=job.id).values_list("dirty_task", flat=True)
        snapshot = record.first() if record.exists() else None
        return snapshot if snapshot else dict(DISABLED_SUMMARY)
    if job.dirty_threshold <= 0:
        return dict(DISABLED_SUMMARY)
    state = DirtyJobState.objects.filter(job_id=job.id).first()
    return summary(job, state, global_sequence())


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
    ``evaluate`` (for lists and the ``?dirty=`` / ``?evaluationStatus=`` filters)."""
    sequence = Subquery(ClusterState.objects.filter(id=1).values("member_event_sequence")[:1])
    history_status = KeyTextTransform("evaluationStatus", "history__dirty_task")
    return queryset.annotate(
        dirty_evaluation=Case(
            When(status__in=JOB_TERMINAL, then=Coalesce(history_status, Value(DISABLED))),
            When(dirty_threshold__lte=0, then=Value(DISABLED)),
            When(dirty_state__isnull=True, then=Value(UNKNOWN)),
            When(dirty_state__schema_version__gt=SCHEMA_VERSION, then=Value(UNKNOWN)),
            When(dirty_state__dirty=True, then=Value(DIRTY)),
            When(dirty_state__tracking_complete=False, then=Value(UNKNOWN)),
            When(dirty_state__processed_member_event_sequence__lt=sequence, then=Value(UNKNOWN)),
            default=Value(CLEAN),
            output_field=CharField(),
        ),
        dirty_attempts=Case(
            When(
                status__in=JOB_TERMINAL,
                then=Cast(
                    KeyTextTransform("recoveryAttemptCount", "history__dirty_task"),
                    IntegerField(),
                ),
            ),
            default="dirty_state__recovery_attempt_count",
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
