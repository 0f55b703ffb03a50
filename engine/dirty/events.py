"""One builder per ``dirty.*`` event kind: what the tracker records, and the one place each
payload is shaped. The incidents of a whole member loss are also inserted set-based by
engine.dirty.member_loss, with the payload of ``incident``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.models import EngineEvent, Member


def _event(kind: str, job_id: int | None, epoch: int | None, payload: dict[str, Any]):
    return EngineEvent(kind=f"dirty.{kind}", job_id=job_id, epoch=epoch, payload=payload)


def incident_payload(
    member: Member,
    classification: str,
    episode_id: int,
    episode_started: bool,
    sequence: int | None,
) -> dict:
    return {
        "lostMemberUuid": str(member.uuid),
        "lostAddress": member.address,
        "classification": classification,
        "episodeId": episode_id,
        "episodeStarted": episode_started,
        "memberEventSequence": sequence,
    }


def incident(job_id: int, epoch: int | None, **payload) -> EngineEvent:
    """``member`` was lost and affected the job (payload: ``incident_payload``)."""
    return _event("incident", job_id, epoch, incident_payload(**payload))


def attempt_prepared(
    job_id: int,
    epoch: int | None,
    attempt_id: str,
    episode_id: int,
    pipeline_index: int,
    prepare_sequence: int,
) -> EngineEvent:
    return _event(
        "attempt-prepared",
        job_id,
        epoch,
        {
            "attemptId": attempt_id,
            "episodeId": episode_id,
            "pipelineId": pipeline_index,
            "prepareSequence": prepare_sequence,
        },
    )


def attempt_confirmed(
    job_id: int,
    epoch: int | None,
    attempt_id: str,
    episode_id: int,
    generation: int,
    counted: bool,
    recovery_attempt_count: int,
) -> EngineEvent:
    return _event(
        "attempt-confirmed",
        job_id,
        epoch,
        {
            "attemptId": attempt_id,
            "episodeId": episode_id,
            "generation": generation,
            "counted": counted,
            "recoveryAttemptCount": recovery_attempt_count,
        },
    )


def attempt_aborted(
    job_id: int,
    epoch: int | None,
    attempt_id: str,
    pipeline_index: int,
    restore: int,
    reason: str,
) -> EngineEvent:
    return _event(
        "attempt-aborted",
        job_id,
        epoch,
        {
            "attemptId": attempt_id,
            "pipelineId": pipeline_index,
            "restore": restore,
            "reason": reason,
        },
    )


def marked(
    job_id: int, epoch: int | None, recovery_attempt_count: int, threshold: int, attempt_id: str
) -> EngineEvent:
    return _event(
        "marked",
        job_id,
        epoch,
        {
            "recoveryAttemptCount": recovery_attempt_count,
            "threshold": threshold,
            "attemptId": attempt_id,
        },
    )


def episode_ended(
    job_id: int, epoch: int | None, episode_id: int, completed: bool, reason: str
) -> EngineEvent:
    """``episode-completed`` (the job runs again) or ``episode-aborted``."""
    kind = "episode-completed" if completed else "episode-aborted"
    return _event(kind, job_id, epoch, {"episodeId": episode_id, "reason": reason})


def tracking_incomplete(job_id: int, epoch: int | None, reason: str) -> EngineEvent:
    return _event("tracking-incomplete", job_id, epoch, {"reason": reason})


def tracker_failed(
    job_ids: Iterable[int], epoch: int | None, where: str, error: str, **extra
) -> list[EngineEvent]:
    """One event per job, or one without a job for a cluster-wide step."""
    payload = {"where": where, "error": error[:500], **extra}
    return [_event("tracker-failed", job_id, epoch, dict(payload)) for job_id in job_ids or [None]]


def repaired(job_id: int, epoch: int | None, gaps: int) -> EngineEvent:
    return _event("repaired", job_id, epoch, {"gaps": gaps})


def snapshot(job_id: int, epoch: int | None, summary: dict | None) -> EngineEvent:
    """The finished job's summary went into its history (the label fields of it)."""
    summary = summary or {}
    return _event(
        "snapshot",
        job_id,
        epoch,
        {k: summary.get(k) for k in ("dirty", "evaluationStatus", "recoveryAttemptCount")},
    )


def acknowledged(
    job_id: int, *, by: str, reason: str, previous_reason: str | None, evaluation: str
) -> EngineEvent:
    """An operator acknowledged the job's UNKNOWN evaluation after checking it."""
    return _event(
        "acknowledged",
        job_id,
        None,
        {"by": by, "reason": reason, "previousReason": previous_reason, "evaluation": evaluation},
    )
