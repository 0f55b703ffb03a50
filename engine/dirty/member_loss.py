"""Member loss: the incidents of a lost member for every tracking-enabled job it affected,
registered in the transaction that ends the membership, in a constant number of statements."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.db import connection, transaction

from engine.dirty import events as dirty_events
from engine.dirty.tracking import (
    classify_leave,
    contained,
    lock_state,
    record_gap,
    tracker_failed,
)
from engine.events import APPEND_PRELUDE, APPEND_PRELUDE_PARAMS, append_events
from engine.models import EngineEvent, Member
from engine.roundtrips import in_savepoint
from engine.states import (
    EXECUTION_DEPLOYED,
    EpisodeStatus,
    ExecutionStatus,
    LeaveClassification,
)

log = logging.getLogger("keel.dirty")


#: Task-group statuses of jobs a member loss does not concern (not placed on a member).
NOT_AFFECTED = sorted(frozenset(ExecutionStatus) - EXECUTION_DEPLOYED)

#: The enabled jobs with live task groups on the lost member (the tracker's definition of an
#: affected job).
_AFFECTED = """
    s.job_id IN (SELECT t.job_id FROM engine_taskgroup t
                  WHERE t.member_id = %(member)s::bigint
                    AND t.status <> ALL(%(not_affected)s::text[]))
"""

#: The affected jobs without locks: the scan of the job-by-job retry (the batch rolled back).
_SCAN_AFFECTED = f"SELECT s.job_id FROM engine_dirtyjobstate s WHERE {_AFFECTED} ORDER BY s.job_id"

#: Lock the selected state rows in job order (the lock order of every tracker change).
_LOCK = """
    SELECT s.job_id FROM engine_dirtyjobstate s
     WHERE {selection}
     ORDER BY s.job_id
       FOR NO KEY UPDATE OF s
"""

#: The batch's watermark advance, in the statement that registers the losses (the savepoint
#: around that statement undoes both if it fails).
_ADVANCE = """
    advanced AS (
        UPDATE engine_clusterstate SET dirty_handled_sequence = %(sequence)s::bigint
         WHERE id = 1 AND dirty_handled_sequence = %(sequence)s::bigint - 1
    ),
"""

#: With the selected rows locked by an earlier statement (_LOCK, sent with it; or the restore
#: preparation's lock), whose snapshot therefore sees their latest values: register the
#: incidents not registered yet, open an episode where none is active, and count. One
#: statement whatever the number of jobs.
_MERGE = """
WITH {advance} locked AS (
    SELECT s.job_id, s.active_episode_id
      FROM engine_dirtyjobstate s
     WHERE {selection}
       AND NOT EXISTS (SELECT 1 FROM engine_memberlossincident i
                        WHERE i.job_id = s.job_id AND i.lost_member_uuid = %(uuid)s::uuid)
), opened AS (
    INSERT INTO engine_recoveryepisode
           (job_id, status, classification, generation, started_at, last_activity_at, end_reason)
    SELECT job_id, %(active)s::text, %(classification)s::text, 0, now(), now(), ''
      FROM locked WHERE active_episode_id IS NULL
    RETURNING id, job_id
), bound AS (
    -- Each job's episode: its active one, or the one just opened (a union, not a join: the
    -- planner takes a CTE for one row, and a nested loop over two would be quadratic).
    SELECT job_id, active_episode_id AS episode_id, false AS opened
      FROM locked WHERE active_episode_id IS NOT NULL
    UNION ALL
    SELECT job_id, id, true FROM opened
), incidents AS (
    INSERT INTO engine_memberlossincident
           (job_id, episode_id, lost_member_uuid, lost_address, classification,
            member_event_sequence, at)
    SELECT job_id, episode_id, %(uuid)s::uuid, %(address)s::text, %(classification)s::text,
           %(sequence)s::bigint, now()
      FROM bound
), continued AS (
    -- An UNCLASSIFIED incident makes its whole episode count (only an episode made of
    -- PLANNED_VERIFIED incidents alone may be left uncounted).
    UPDATE engine_recoveryepisode e
       SET last_activity_at = now(),
           classification = CASE WHEN %(classification)s::text = %(unclassified)s::text
                                 THEN %(unclassified)s::text
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

#: The enumerations _MERGE writes and compares.
_MERGE_VALUES = {
    "active": EpisodeStatus.ACTIVE,
    "unclassified": LeaveClassification.UNCLASSIFIED,
}

#: The member's own ``member.*`` event and the ``dirty.incident`` events of its loss, in that
#: order, in one statement (MemberLossEvents.append, after the append prelude: engine.events).
_EVENTS = """
INSERT INTO engine_engineevent (at, kind, job_id, member_id, epoch, payload)
SELECT now(), e.kind, e.job_id, e.member_id, e.epoch, e.payload
  FROM (SELECT 0 AS part, %(kind)s::text AS kind, NULL::bigint AS job_id,
               %(member)s::bigint AS member_id, %(ended_epoch)s::bigint AS epoch,
               %(payload)s::text::jsonb AS payload
         WHERE %(kind)s::text IS NOT NULL
        UNION ALL
        SELECT 1, 'dirty.incident', v.job_id, NULL, %(epoch)s::bigint,
               %(common)s::text::jsonb
               || jsonb_build_object('episodeId', v.episode_id, 'episodeStarted', v.opened)
          FROM unnest(%(jobs)s::bigint[], %(episodes)s::bigint[], %(opened)s::boolean[])
               AS v(job_id, episode_id, opened)) e
 ORDER BY e.part, e.job_id
"""


@dataclass
class MemberLossEvents:
    """The ``dirty.*`` events of one member event, appended after the caller's own ``member.*``
    event once the tracked rows are written: the append lock is taken last, so waiting for a
    job's state row never happens while holding it (engine.events)."""

    member: Member
    sequence: int
    epoch: int | None
    classification: str
    incidents: list[tuple[int, int, bool]]  # (job id, episode id, episode opened)
    failures: list[EngineEvent]

    @property
    def registered(self) -> int:
        return len(self.incidents)

    def append(self, ended: EngineEvent | None = None) -> None:
        """Append ``ended`` (the member's own event, if any) and then these events, inside the
        caller's transaction. Never fails for the ``dirty.*`` events: should they not insert,
        ``ended`` is appended alone and the tracked state is committed with the removal all the
        same."""
        if not self.incidents:
            append_events([ended] if ended else [])
        else:
            try:
                in_savepoint(
                    "member_loss_events",
                    [
                        (APPEND_PRELUDE[0], None),
                        (APPEND_PRELUDE[1], APPEND_PRELUDE_PARAMS),
                        (_EVENTS, self._parameters(ended)),
                    ],
                )
            except Exception:
                log.exception(
                    "could not append the dirty.* events of member event %s", self.sequence
                )
                append_events([ended] if ended else [])
        if self.failures:
            try:
                with transaction.atomic():
                    EngineEvent.objects.bulk_create(self.failures)
            except Exception:
                log.exception(
                    "could not append the tracker's failures of member event %s", self.sequence
                )

    def _parameters(self, ended: EngineEvent | None) -> dict:
        events = {
            "kind": ended and ended.kind,
            "member": ended and ended.member_id,
            "ended_epoch": ended and ended.epoch,
            "epoch": self.epoch,
            "payload": json.dumps(ended and ended.payload),
        }
        common = {
            "lostMemberUuid": str(self.member.uuid),
            "lostAddress": self.member.address,
            "classification": self.classification,
            "memberEventSequence": self.sequence,
        }
        return {
            **events,
            "common": json.dumps(common),
            "jobs": [i[0] for i in self.incidents],
            "episodes": [i[1] for i in self.incidents],
            "opened": [i[2] for i in self.incidents],
        }


def on_member_lost(
    member: Member, sequence: int, epoch: int | None, classification: str | None = None
) -> MemberLossEvents:
    """Handle member event ``sequence`` (``member`` was REMOVED or LEFT) for every enabled job.

    Runs inside the transaction that ended the membership and bumped the sequence, before the
    master fails the member's task groups. A constant number of statements whatever the number
    of jobs; if the batch fails, each affected job is retried alone, so one bad job only makes
    itself UNKNOWN (a gap freezes its watermark). Never raises; the caller appends the returned
    events after its own.
    """
    classification = classification or classify_leave(member)
    out = MemberLossEvents(member, sequence, epoch, classification, [], [])
    try:
        out.incidents = _register_losses(member, sequence, classification, None)
        return out  # the watermark advanced in the same statement (_ADVANCE)
    except Exception as exc:  # the batch failed: isolate the job(s) that cannot be tracked
        log.warning("batched member-loss tracking failed, retrying job by job: %s", exc)
        out.incidents = []
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(_SCAN_AFFECTED, {"member": member.id, "not_affected": NOT_AFFECTED})
            affected = [r[0] for r in cur.fetchall()]
    except Exception as exc:
        out.failures += tracker_failed([], epoch, "member-loss scan", exc)
        return out  # the shared watermark stays behind: every enabled job reads UNKNOWN
    for job_id in affected:
        try:
            out.incidents += _register_losses(member, sequence, classification, [job_id])
        except Exception as exc:
            out.failures += tracker_failed([job_id], epoch, "member-loss incident", exc)
            if not record_gap(job_id, str(exc), sequence=sequence):
                out.failures += tracker_failed([], epoch, "tracking gap", exc)
                return out  # cannot record the gap: the shared watermark stays behind
    try:
        with transaction.atomic():
            _advance_watermark(sequence)
    except Exception as exc:
        out.failures += tracker_failed([], epoch, "member-event watermark", exc)
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
    """Register ``member``'s loss for the affected enabled jobs (all, or ``only``), in one
    statement under a savepoint of its own (rolled back if it fails); returns (job id, episode
    id, episode opened) of each job that got a new incident. For all of them (the batch), the
    shared watermark advances to ``sequence`` in the same statement."""
    params = {
        "member": member.id,
        "not_affected": NOT_AFFECTED,
        "uuid": member.uuid,
        "address": member.address,
        "classification": classification,
        "sequence": sequence,
        "only": only or [],
        **_MERGE_VALUES,
    }
    selection = _AFFECTED if only is None else f"{_AFFECTED} AND s.job_id = ANY(%(only)s::bigint[])"
    merge = _MERGE.format(advance=_ADVANCE if only is None else "", selection=selection)
    # The lock first, in a statement of its own: the merge's snapshot, taken after the locks
    # were granted, then sees what a transaction that held a row committed (its episode, say).
    lock = _LOCK.format(selection=selection)
    steps = [(lock, params), (merge, params)]
    return [tuple(row) for row in in_savepoint("member_loss", steps)]


def merge_incidents(
    member: Member, epoch: int | None, classification: str, job_id: int
) -> list[EngineEvent]:
    """Restore preparation's merge of a loss not registered yet (state row locked by the
    caller): the same statement, without touching the watermark; events returned."""
    with connection.cursor() as cur:
        cur.execute(
            _MERGE.format(advance="", selection="s.job_id = %(job)s"),
            {
                "job": job_id,
                "uuid": member.uuid,
                "address": member.address,
                "classification": classification,
                "sequence": None,
                **_MERGE_VALUES,
            },
        )
        bound = cur.fetchall()
    return [
        dirty_events.incident(
            job_id,
            epoch,
            member=member,
            classification=classification,
            episode_id=episode_id,
            episode_started=opened,
            sequence=None,
        )
        for job_id, episode_id, opened in bound
    ]


def on_planned_move(job, member: Member, epoch: int | None) -> list[EngineEvent]:
    """The active master is moving the job's task groups off ``member`` because an operator
    drained it (job row locked by the caller): register the loss as PLANNED_VERIFIED before the
    task groups fail, so the restore binds to an episode that counts only if an UNCLASSIFIED
    incident joins it. Never raises: a failure leaves the loss to restore preparation, which
    registers it UNCLASSIFIED (counted: the safe side)."""
    if job.dirty_threshold <= 0:
        return []
    try:
        with transaction.atomic():
            if lock_state(job.id) is None:
                return []
            return merge_incidents(member, epoch, LeaveClassification.PLANNED_VERIFIED, job.id)
    except Exception as exc:
        return contained(job, epoch, "planned-leave incident", exc, repairable=False)
