"""The read side: a job's evaluation, its dirtyTask summary, its episodes, and list
annotations and filters in SQL."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Case, CharField, Exists, F, IntegerField, OuterRef, Q, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from engine.dirty.tracking import SCHEMA_VERSION, options
from engine.models import (
    ClusterState,
    DirtyJobState,
    DirtyTrackingGap,
    Job,
    MasterCandidate,
    Member,
    MemberLossIncident,
    RecoveryAttempt,
    RecoveryEpisode,
)
from engine.protocol import DIRTY_TRACKING_SINCE
from engine.states import JOB_TERMINAL, CandidateState, DirtyEvaluation
from history.models import JobHistory


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
        return DirtyEvaluation.UNKNOWN
    if state.dirty:
        return DirtyEvaluation.DIRTY
    if not sequences.complete:
        return DirtyEvaluation.UNKNOWN
    return DirtyEvaluation.CLEAN


def _millis(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


DISABLED_SUMMARY = {"evaluationStatus": DirtyEvaluation.DISABLED, "dirty": False}


def missing_summary(job: Job, reason: str) -> dict:
    return {
        "dirty": False,
        "evaluationStatus": DirtyEvaluation.UNKNOWN,
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
        **acknowledgement(None, None, None),
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
        "dirty": evaluation == DirtyEvaluation.DIRTY,
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
        **acknowledgement(state.acknowledged_by, state.acknowledged_at, state.acknowledged_reason),
    }


def acknowledgement(by: str | None, at: datetime | None, reason: str | None) -> dict:
    """The summary's record of the last operator acknowledgement (engine.dirty.acknowledge): it
    says an operator accepted that the count cannot be verified; it never makes it verified."""
    if at is None:
        return {"acknowledgedBy": None, "acknowledgedAt": None, "acknowledgedReason": None}
    return {"acknowledgedBy": by, "acknowledgedAt": at.isoformat(), "acknowledgedReason": reason}


def job_summary(job: Job) -> dict:
    """``dirtyTask`` of any job: running from its state, finished from its history record. A
    finished job whose snapshot is still to be written reads from its running state. A job that
    did not enable tracking reads DISABLED (an old record without a summary, or none at all, is
    one); an enabled finished job with neither snapshot nor state reads UNKNOWN: what it counted
    is lost, and that is never reported as CLEAN nor as not tracked."""
    if job.dirty_threshold <= 0:
        return dict(DISABLED_SUMMARY)
    if job.status in JOB_TERMINAL:
        snapshot = (
            JobHistory.objects.filter(job_id=job.id).values_list("dirty_task", flat=True).first()
        )
        if snapshot:
            return snapshot
    state = DirtyJobState.objects.filter(job_id=job.id).first()
    if state is None and job.status in JOB_TERMINAL:
        return missing_summary(job, "the finished job has neither a dirty-job snapshot nor state")
    return summary(job, state, Sequences.read(job.id))


def episode_list(job_id: int) -> list[dict]:
    """The bounded recent episodes of a job, newest first (the episodes endpoint's shape)."""
    episodes = list(
        RecoveryEpisode.objects.filter(job_id=job_id).order_by("-id")[: options().history_size]
    )
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
        RecoveryAttempt.objects.filter(episode_id__in=ids).select_related("pipeline").order_by("id")
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
            When(dirty_threshold__lte=0, then=Value(DirtyEvaluation.DISABLED)),
            When(terminal & Q(history__dirty_task__isnull=False), then=history_status),
            When(dirty_state__isnull=True, then=Value(DirtyEvaluation.UNKNOWN)),
            When(
                dirty_state__schema_version__gt=SCHEMA_VERSION, then=Value(DirtyEvaluation.UNKNOWN)
            ),
            When(dirty_state__dirty=True, then=Value(DirtyEvaluation.DIRTY)),
            When(gap, then=Value(DirtyEvaluation.UNKNOWN)),
            When(behind, then=Value(DirtyEvaluation.UNKNOWN)),
            default=Value(DirtyEvaluation.CLEAN),
            output_field=CharField(),
        ),
        dirty_attempts=Coalesce(
            Cast(KeyTextTransform("recoveryAttemptCount", "history__dirty_task"), IntegerField()),
            "dirty_state__recovery_attempt_count",
            output_field=IntegerField(),
        ),
    )


def list_summary(evaluation: str, attempts: int | None) -> dict:
    if evaluation == DirtyEvaluation.DISABLED:
        return dict(DISABLED_SUMMARY)
    return {
        "dirty": evaluation == DirtyEvaluation.DIRTY,
        "evaluationStatus": evaluation,
        "recoveryAttemptCount": attempts or 0,
    }


def dirty_filter(value: bool) -> Q:
    return (
        Q(dirty_evaluation=DirtyEvaluation.DIRTY)
        if value
        else ~Q(dirty_evaluation=DirtyEvaluation.DIRTY)
    )


def older_members() -> list[str]:
    """Alive members and masters that run a protocol older than dirty tracking needs."""
    members = [
        f"member {name} ({uuid}) runs protocol {version}"
        for name, uuid, version in Member.objects.alive()
        .filter(protocol_version__lt=DIRTY_TRACKING_SINCE)
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
