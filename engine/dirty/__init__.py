"""Dirty-job (recovery-degraded) tracking (docs/decisions/0007-dirty-jobs.md).

A job that enables ``job.dirty-task.threshold`` (> 0) is labelled DIRTY once the number of
job-level deployment attempts caused by member loss reaches the threshold. The label is extra
metadata: the job's status and its retries never change because of it.

Vocabulary (of the specification, Zeta's design text):
- member-loss incident: one member (by UUID) left and affected one job; idempotent by
  ``(job, lostMemberUuid)``. Registered in the very transaction that ends the membership,
  before the master fails the member's task groups;
- recovery episode: one continuous recovery; it completes when every pipeline of the job runs
  again with every prepared attempt confirmed, aborts when the job ends first or it goes stale;
- deployment attempt ``<episodeId>-<pipelineId>-<prepareSequence>``: allocated when a restore
  is prepared (engine.jobs.recovery.request_restore), confirmed when the pipeline reaches
  DEPLOYING on its new slots (engine.jobs.recovery.restore_pipeline; a reader restore of a
  running Lane A pipeline: when its readers do). prepareSequence counts per pipeline within
  the episode;
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

Where: the engine calls the tracker inside the transaction of the state change it follows: a
member loss (``member_loss``), a restore prepared, deployed or made obsolete (``attempts``), a
roll-up of a running job (``episodes``), and the job's end, when it gives its part of the
finished-job record (``history``). The active master reconciles what a previous master or a
contained failure left behind (``reconcile``); the API and the dashboard read through
``reading``; ``events`` builds the ``dirty.*`` events and ``tracking`` holds what they share.
"""

from engine.dirty.acknowledge import AcknowledgementRefused, acknowledge
from engine.dirty.attempts import on_restore_deploying, on_restore_obsolete, on_restore_prepared
from engine.dirty.episodes import after_settle, expire_stale_episodes
from engine.dirty.history import history_failed, history_part, pending_history
from engine.dirty.member_loss import (
    NOT_AFFECTED,
    MemberLossEvents,
    on_member_lost,
    on_planned_move,
)
from engine.dirty.reading import (
    Sequences,
    annotate,
    dirty_filter,
    evaluate,
    job_episodes,
    job_summary,
    list_summary,
    older_members,
)
from engine.dirty.reconcile import reconcile
from engine.dirty.tracking import SCHEMA_VERSION, init_state

__all__ = [
    "NOT_AFFECTED",
    "SCHEMA_VERSION",
    "AcknowledgementRefused",
    "MemberLossEvents",
    "Sequences",
    "acknowledge",
    "after_settle",
    "annotate",
    "dirty_filter",
    "evaluate",
    "expire_stale_episodes",
    "history_failed",
    "history_part",
    "init_state",
    "job_episodes",
    "job_summary",
    "list_summary",
    "older_members",
    "on_member_lost",
    "on_planned_move",
    "on_restore_deploying",
    "on_restore_obsolete",
    "on_restore_prepared",
    "pending_history",
    "reconcile",
]
