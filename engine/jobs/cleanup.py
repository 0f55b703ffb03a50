"""Terminal-state cleanup: a finished job's running state is removed once the cleanup delay
has passed, by a durable record that no master failover can lose.

The record is written in the job's terminal transaction (``record_job_state_cleanup``). At its
``due_at`` a Celery task on the control queue executes it (``execute``): under the record's row
lock it removes the job's running state and marks it DONE. The countdown sent at the end is
only a hint; the active master sweeps overdue records (``claim_due``) and enqueues them again,
so a lost message, a dead Celery worker or masters dying one after the other only delay it.
Execution is idempotent: a duplicate delivery, or a second sweeper, finds the record locked or
DONE and changes nothing (``executions`` counts the executions that removed something).

A JOB_STATE record that is done schedules the job's HISTORY record (``engine.history.retention``
after the job ended), which removes the job and its history the same way.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, Sum
from django.db.models.functions import Now

from engine import counters
from engine.connectors.jdbc_prepared import settle_job
from engine.models import (
    Checkpoint,
    ControlStep,
    Job,
    JobCleanupRecord,
    MetricTotal,
    Pipeline,
    Slot,
    SplitAssignment,
    TaskCheckpoint,
    TaskGroup,
)
from engine.states import (
    CLEANUP_OPEN,
    JOB_TERMINAL,
    CheckpointState,
    CleanupKind,
    CleanupState,
    SlotState,
)

log = logging.getLogger("keel.cleanup")

#: A record enqueued this long ago and still not DONE is enqueued again (the message or the
#: worker that took it was lost).
REENQUEUE_AFTER = timedelta(seconds=15)
#: Backoff between failed attempts: BASE * 2**attempts, at most MAX.
BACKOFF_BASE = 1.0
BACKOFF_MAX = 300.0
#: A waiting record is looked at again after as long as it has waited so far, within these
#: bounds (seconds): the wait roughly doubles, and never exceeds the sweep's re-enqueue period.
WAIT_MIN = 1.0
WAIT_MAX = REENQUEUE_AFTER.total_seconds()
#: Records one sweep claims (the rest wait for the next pass).
SWEEP_BATCH = 500
#: Records one Celery message carries (each executed in its own transaction).
MESSAGE_BATCH = 50


class NotReady(Exception):
    """The job's state cannot be removed yet (its history is not written, say): the record
    waits, spending no attempt, and is looked at again soon (``_waiting``)."""


def delay() -> timedelta:
    return timedelta(seconds=float(settings.ENGINE["job-state-cleanup-delay"]))


def record_job_state_cleanup(job: Job) -> None:
    """In the job's terminal transaction: the intent to remove its running state at
    ``end + engine.job-state-cleanup-delay`` (idempotent per job)."""
    JobCleanupRecord.objects.get_or_create(
        job_id=job.id,
        kind=CleanupKind.JOB_STATE,
        defaults={"job_name": job.name, "due_at": job.finished_at + delay()},
    )
    transaction.on_commit(lambda: hint_at_due(job.id, delay().total_seconds()))


def hint_at_due(job_id: int, countdown: float) -> None:
    """A Celery countdown to execute the job's record when due: only a hint (the active
    master's sweep is what guarantees it), so a broker that is down costs nothing here."""
    if not settings.ENGINE["job-state-cleanup.hint"]:
        return  # the sweep alone delivers it (tests that the sweep does)
    from celery import current_app

    from engine.protocol import CONTROL_QUEUE, TASK_CLEANUP

    record = (
        JobCleanupRecord.objects.filter(job_id=job_id, kind=CleanupKind.JOB_STATE)
        .values_list("id", flat=True)
        .first()
    )
    if record is None:
        return
    try:
        current_app.send_task(
            TASK_CLEANUP, args=[[record]], queue=CONTROL_QUEUE, countdown=max(countdown, 0)
        )
    except Exception as exc:  # the sweep enqueues it anyway
        log.info("cleanup hint for job %s not sent (%s); the sweep will enqueue it", job_id, exc)


# -- the active master's sweep ------------------------------------------------------------------


def claim_due(limit: int = SWEEP_BATCH) -> list[int]:
    """Overdue PENDING records not enqueued recently, claimed (``enqueued_at``) in due order
    under ``FOR UPDATE SKIP LOCKED``; the caller (fenced, the active master) enqueues them."""
    ids = list(
        JobCleanupRecord.objects.select_for_update(skip_locked=True)
        .filter(state=CleanupState.PENDING, due_at__lte=Now())
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=Now() - REENQUEUE_AFTER))
        .order_by("due_at", "id")
        .values_list("id", flat=True)[:limit]
    )
    if ids:
        JobCleanupRecord.objects.filter(id__in=ids).update(enqueued_at=Now())
    return ids


def overdue_count() -> int:
    return JobCleanupRecord.objects.filter(state__in=CLEANUP_OPEN, due_at__lt=Now()).count()


# -- execution (any worker's Celery pool) -------------------------------------------------------


def execute(record_id: int) -> str:
    """Execute one record if it is due and open; what happened, in a word or two."""
    try:
        settled = _settle_first(record_id)
        with transaction.atomic():
            record = (
                JobCleanupRecord.objects.select_for_update(skip_locked=True)
                .filter(id=record_id)
                .first()
            )
            if record is None:
                return "held by another execution, or gone"
            if record.state not in CLEANUP_OPEN:
                return f"{record.state.lower()} already"
            if record.due_at > _now():
                return "not due yet"
            removed = _REMOVERS[record.kind](record) + settled
            JobCleanupRecord.objects.filter(id=record.id).update(
                state=CleanupState.DONE,
                executed_at=Now(),
                attempts=F("attempts") + 1,
                executions=F("executions") + 1,
                last_error="",
            )
            if record.kind == CleanupKind.JOB_STATE:
                _schedule_history_cleanup(record)
        log.info("cleanup %s of job %s done: %s", record.kind, record.job_id, removed)
        return "done"
    except NotReady as exc:
        _waiting(record_id, exc)
        return f"waiting: {exc}"
    except Exception as exc:
        _failed(record_id, exc)
        return f"failed: {exc}"


def _waiting(record_id: int, exc: NotReady) -> None:
    """Waiting is not failing: the record stays PENDING, spends no attempt and says why in
    ``last_error``. Its due time stays, so a wait that never ends (a history never written)
    shows in the overdue count, its metric and alert, instead of waiting unseen. The sweep
    sends it again once it has waited as long again (WAIT_MIN to WAIT_MAX)."""
    log.info("cleanup record %s waits: %s", record_id, exc)
    with transaction.atomic():
        record = (
            JobCleanupRecord.objects.select_for_update()
            .filter(id=record_id, state__in=CLEANUP_OPEN)
            .first()
        )
        if record is None:
            return
        now = _now()
        retry_in = min(max((now - record.due_at).total_seconds(), WAIT_MIN), WAIT_MAX)
        JobCleanupRecord.objects.filter(id=record_id).update(
            state=CleanupState.PENDING,
            last_error=f"waiting: {exc}"[:2000],
            # claim_due sends again what was enqueued REENQUEUE_AFTER ago: retry_in from now.
            enqueued_at=now - REENQUEUE_AFTER + timedelta(seconds=retry_in),
        )


def _failed(record_id: int, exc: Exception) -> None:
    """Record a real failure; retry with backoff until max attempts, then FAILED (visible,
    and retried by hand from the admin)."""
    log.warning("cleanup record %s failed: %s", record_id, exc)
    limit = int(settings.ENGINE["job-state-cleanup.max-attempts"])
    with transaction.atomic():
        record = JobCleanupRecord.objects.select_for_update().filter(id=record_id).first()
        if record is None or record.state == CleanupState.DONE:
            return
        attempts = record.attempts + 1
        backoff = min(BACKOFF_BASE * 2 ** (attempts - 1), BACKOFF_MAX)
        JobCleanupRecord.objects.filter(id=record_id).update(
            attempts=attempts,
            last_error=str(exc)[:2000] or type(exc).__name__,
            state=CleanupState.FAILED if attempts >= limit else CleanupState.PENDING,
            due_at=Now() + timedelta(seconds=backoff),
            enqueued_at=None,
        )


def _now():
    from engine.jobs.checkpoints import database_now

    return database_now()


def _remove_job_state(record: JobCleanupRecord) -> str:
    """The job's running state: checkpoints and acks, split assignments, task groups (and any
    slot the job still holds), pipelines, control steps. The job row (its tombstone) and its
    history stay; the job's detail reads from the history from now on."""
    job = Job.objects.select_for_update(no_key=True).filter(id=record.job_id).first()
    if job is None:
        return "nothing (the job is gone)"
    if job.status not in JOB_TERMINAL:
        raise NotReady(f"job {job.id} is {job.status}, not ended")
    if not _history_written(job.id):
        raise NotReady(f"the history record of job {job.id} is not written yet")
    groups = TaskGroup.objects.filter(job=job)
    totals = groups.aggregate(
        read=Sum("source_received"),
        written=Sum("sink_written"),
        read_bytes=Sum("source_received_bytes"),
        written_bytes=Sum("sink_written_bytes"),
    )
    counters.bump(
        [
            (counters.ROWS_RETIRED, "read", totals["read"] or 0),
            (counters.ROWS_RETIRED, "written", totals["written"] or 0),
            (counters.BYTES_RETIRED, "read", totals["read_bytes"] or 0),
            (counters.BYTES_RETIRED, "written", totals["written_bytes"] or 0),
        ]
    )
    # The job's own totals: its series left the exposition when it ended.
    MetricTotal.objects.filter(name__in=counters.PER_JOB, label=str(job.id)).delete()
    freed = _free_slots_held(job)
    acks, _ = TaskCheckpoint.objects.filter(checkpoint__job=job).delete()
    checkpoints, _ = Checkpoint.objects.filter(job=job).delete()
    splits, _ = SplitAssignment.objects.filter(pipeline__job=job).delete()
    steps, _ = ControlStep.objects.filter(job=job).delete()
    task_groups, _ = groups.delete()
    pipelines, _ = Pipeline.objects.filter(job=job).delete()
    return (
        f"{pipelines} pipelines, {task_groups} task groups, {checkpoints} checkpoints "
        f"({acks} acks), {splits} split assignments, {steps} control steps, {freed} slots freed"
    )


def _settle_first(record_id: int) -> str:
    """A due job-state record's prepared transactions, settled before its transaction: the
    calls to the sinks' databases never run inside a transaction of the engine's own (whose
    idle limit would end it). Safe before the record's lock: a terminal job's completed
    checkpoints no longer change, and settling twice changes nothing."""
    record = JobCleanupRecord.objects.filter(
        id=record_id, kind=CleanupKind.JOB_STATE, state__in=CLEANUP_OPEN
    ).first()
    if record is None or record.due_at > _now():
        return ""
    job = Job.objects.filter(id=record.job_id, status__in=JOB_TERMINAL).first()
    return _settle_prepared(job) if job is not None else ""


def _settle_prepared(job: Job) -> str:
    """Transactions the job's two-phase Jdbc sinks left prepared (a cancel, a failure with no
    retry left): committed up to their pipeline's newest completed checkpoint, the rest rolled
    back, so none holds its locks and the server's oldest transaction horizon for ever. It
    runs before the checkpoints go; a database that cannot be reached fails the record, which
    is retried."""
    if not job.uuid or not job.env.get("checkpoint.interval"):
        return ""
    sinks: dict[tuple, dict] = {}
    for plan in Pipeline.objects.filter(job=job).values_list("plan", flat=True):
        for node in (plan or {}).get("sinks", []):
            config = node.get("config") or {}
            if node.get("plugin") == "Jdbc" and config.get("is_exactly_once"):
                key = (config.get("connection"), config.get("url"), config.get("user"))
                sinks.setdefault(key, config)
    if not sinks:
        return ""
    completed = dict(
        Checkpoint.objects.filter(job=job, state=CheckpointState.COMPLETED)
        .values("pipeline__index")
        .annotate(newest=Max("id"))
        .values_list("pipeline__index", "newest")
    )
    committed = rolled_back = 0
    for config in sinks.values():
        done = settle_job(config, str(job.uuid), completed)
        committed, rolled_back = committed + done[0], rolled_back + done[1]
    return f", prepared transactions: {committed} committed, {rolled_back} rolled back"


def _free_slots_held(job: Job) -> int:
    """Free the slots the ended job still holds: none, as its task groups let go of theirs
    when they ended; a slot another job's live task group holds is never the job's to free.

    The slots are locked first (lock order: job, task groups, slots), so a take that is giving
    one to another job has committed before the check looks for its holder."""
    held = sorted(
        TaskGroup.objects.filter(job=job, slot__isnull=False).values_list("slot_id", flat=True)
    )
    if not held:
        return 0
    list(Slot.objects.select_for_update(no_key=True).filter(id__in=held).order_by("id"))
    others = TaskGroup.objects.live().filter(slot=OuterRef("pk")).exclude(job=job)
    return (
        Slot.objects.filter(id__in=held, state=SlotState.ASSIGNED)
        .exclude(Exists(others))
        .update(state=SlotState.FREE)
    )


def _history_written(job_id: int) -> bool:
    from history.models import JobHistory

    return JobHistory.objects.filter(job_id=job_id, summary__isnull=False).exists()


def _remove_history(record: JobCleanupRecord) -> str:
    """The job itself, its history and whatever still refers to it (its events stay until
    the event retention: they are the log)."""
    deleted, _ = Job.objects.filter(id=record.job_id, status__in=JOB_TERMINAL).delete()
    return f"{deleted} rows of the job and its history"


_REMOVERS = {CleanupKind.JOB_STATE: _remove_job_state, CleanupKind.HISTORY: _remove_history}


def _schedule_history_cleanup(record: JobCleanupRecord) -> None:
    finished = Job.objects.filter(id=record.job_id).values_list("finished_at", flat=True).first()
    if finished is None:
        return
    retention = timedelta(seconds=float(settings.ENGINE["history.retention"]))
    JobCleanupRecord.objects.get_or_create(
        job_id=record.job_id,
        kind=CleanupKind.HISTORY,
        defaults={"job_name": record.job_name, "due_at": finished + retention},
    )


# -- by hand (the admin console) -------------------------------------------------------------


def run_now(record_id: int) -> bool:
    """Make an open record due now (the sweep, or the message sent next, executes it)."""
    return (
        JobCleanupRecord.objects.filter(id=record_id, state__in=CLEANUP_OPEN).update(
            due_at=Now(), enqueued_at=None
        )
        == 1
    )


def retry_failed(record_id: int) -> bool:
    """A FAILED record goes back to PENDING, due now, with a fresh count of attempts."""
    return (
        JobCleanupRecord.objects.filter(id=record_id, state=CleanupState.FAILED).update(
            state=CleanupState.PENDING, due_at=Now(), enqueued_at=None, attempts=0
        )
        == 1
    )


def enqueue(record_ids: list[int]) -> None:
    """Put records on the control queue now, in messages of MESSAGE_BATCH (by name)."""
    from celery import current_app

    from engine.protocol import CONTROL_QUEUE, TASK_CLEANUP

    for start in range(0, len(record_ids), MESSAGE_BATCH):
        current_app.send_task(
            TASK_CLEANUP, args=[record_ids[start : start + MESSAGE_BATCH]], queue=CONTROL_QUEUE
        )
