"""Retention: the active master's durable sweeps of the tables that grow without bound.

Each sweep deletes one bounded batch per table under the master's epoch and says whether it
did work, so the loop runs it again at once while a backlog lasts and a new master simply goes
on (the rows are the state; nothing is remembered between batches):
- events older than ``engine.retention.events-age`` or beyond the newest
  ``engine.retention.events-count``;
- REMOVED and LEFT members (their slots with them), DONE control steps, and the split
  assignments of ended jobs, once older than ``engine.retention.ended-age``.
- DONE cleanup records of jobs that are gone (their HISTORY record removed them), once older
  than ``engine.retention.ended-age``.
Finished jobs' running state and, later, their history are removed by their cleanup records
(engine.jobs.cleanup), not here.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from engine.fencing import fenced
from engine.models import ControlStep, EngineEvent, Job, JobCleanupRecord, Member, SplitAssignment
from engine.states import JOB_TERMINAL, CleanupKind, CleanupState, ControlStepState, MemberState

BATCH = 5000


def sweep(epoch: int) -> bool:
    """One batch of every kind; True while some kind had a full batch (more is waiting)."""
    options = settings.ENGINE
    ended_before = timezone.now() - timedelta(seconds=options["retention.ended-age"])
    full = False
    for deleted in (
        _events(epoch, options["retention.events-age"], options["retention.events-count"]),
        _members(epoch, ended_before),
        _control_steps(epoch, ended_before),
        _split_assignments(epoch, ended_before),
        _cleanup_records(epoch, ended_before),
    ):
        full = full or deleted >= BATCH
    return full


def _delete_batch(epoch: int, queryset, key: str = "pk") -> int:
    ids = list(queryset.order_by(key).values_list(key, flat=True)[:BATCH])
    if not ids:
        return 0
    with fenced(epoch):
        return queryset.model.objects.filter(**{f"{key}__in": ids}).delete()[0]


def _events(epoch: int, age: float, count: int) -> int:
    """Two index range scans (by time, by seq), each cheap when nothing is due."""
    old = EngineEvent.objects.filter(at__lt=timezone.now() - timedelta(seconds=age))
    deleted = _delete_batch(epoch, old, key="seq")
    newest = EngineEvent.objects.order_by("-seq").values_list("seq", flat=True).first()
    if newest is not None and newest > count:
        deleted += _delete_batch(
            epoch, EngineEvent.objects.filter(seq__lte=newest - count), key="seq"
        )
    return deleted


def _members(epoch: int, ended_before) -> int:
    ended = Member.objects.filter(
        state__in=(MemberState.REMOVED, MemberState.LEFT), ended_at__lt=ended_before
    )
    return _delete_batch(epoch, ended)


def _control_steps(epoch: int, ended_before) -> int:
    done = ControlStep.objects.filter(state=ControlStepState.DONE, done_at__lt=ended_before)
    return _delete_batch(epoch, done)


def _split_assignments(epoch: int, ended_before) -> int:
    jobs = Job.objects.filter(status__in=JOB_TERMINAL, finished_at__lt=ended_before)
    return _delete_batch(epoch, SplitAssignment.objects.filter(pipeline__job__in=jobs))


def _cleanup_records(epoch: int, ended_before) -> int:
    gone = JobCleanupRecord.objects.filter(
        kind=CleanupKind.HISTORY, state=CleanupState.DONE, executed_at__lt=ended_before
    ).values("job_id")
    return _delete_batch(epoch, JobCleanupRecord.objects.filter(job_id__in=gone))
