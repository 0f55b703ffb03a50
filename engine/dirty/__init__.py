"""Dirty-job (recovery-degraded) tracking (docs/decisions/0007-dirty-jobs.md).

The engine calls the tracker at four points, each inside the transaction of the state change it
follows: a member loss (``member_loss``), a restore prepared, deployed or made obsolete
(``attempts``), a roll-up of a running job (``episodes``) and the job's end, when it gives its
part of the finished-job record (``history``). The active master
reconciles what a previous master or a contained failure left behind (``reconcile``); the API and
the dashboard read through ``reading``. ``tracking`` holds what they share.
"""

from engine.dirty.attempts import on_restore_deploying, on_restore_obsolete, on_restore_prepared
from engine.dirty.episodes import after_settle, expire_stale_episodes
from engine.dirty.history import history_part, pending_history
from engine.dirty.member_loss import NOT_AFFECTED, MemberLossEvents, on_member_lost
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
    "MemberLossEvents",
    "Sequences",
    "after_settle",
    "annotate",
    "dirty_filter",
    "evaluate",
    "expire_stale_episodes",
    "history_part",
    "init_state",
    "job_episodes",
    "job_summary",
    "list_summary",
    "older_members",
    "on_member_lost",
    "on_restore_deploying",
    "on_restore_obsolete",
    "on_restore_prepared",
    "pending_history",
    "reconcile",
]
