"""The engine's own state transitions, driven step by step on real PostgreSQL without processes.

``Engine`` plays the active master and the members by calling the very functions they call
(membership, scheduler, lifecycle, orchestration, recovery): members are real registrations
holding their own sessions and advisory locks; nothing is mocked. Deploy commands are not sent
(there is no worker to run them); ``run_deployed`` reports RUNNING as a member would.
"""

from __future__ import annotations

import itertools

from django.db import transaction

from engine import dirty
from engine.cluster import membership
from engine.jobs import lifecycle, recovery
from engine.jobs.cancel import cancel_job
from engine.jobs.scheduler import schedule_next
from engine.jobs.submission import submit_job
from engine.master import orchestration
from engine.models import (
    ClusterState,
    ControlStep,
    DirtyJobState,
    Job,
    MasterLease,
    Member,
    Pipeline,
    TaskGroup,
)
from engine.states import ControlStepState, ExecutionStatus, JobStatus, MemberState, SlotMode

TWO_PIPELINES = """
env {{ job.mode = STREAMING, parallelism = 1, job.retry.times = {retries},
      job.retry.interval.seconds = 0, job.dirty-task.threshold = {threshold} }}
source {{
  FakeSource {{ plugin_output = a, rows.per-second = 10 }}
  FakeSource {{ plugin_output = b, rows.per-second = 10 }}
}}
sink {{
  Blackhole {{ plugin_input = a }}
  Blackhole {{ plugin_input = b }}
}}
"""

_names = itertools.count(1)


class Engine:
    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        MasterLease.objects.update_or_create(id=1, defaults={"epoch": epoch, "holder": "test"})
        ClusterState.objects.get_or_create(id=1)
        self.sessions: dict[int, membership.MemberSession] = {}

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    # -- members --------------------------------------------------------------------------

    def add_member(self, slots: int = 4, tags: dict[str, str] | None = None) -> Member:
        name = f"sim-{next(_names)}"
        session = membership.register_member(name, slots, SlotMode.FIXED, tags=tags)
        self.sessions[session.id] = session
        return Member.objects.get(id=session.id)

    def alive(self) -> list[Member]:
        return list(Member.objects.filter(state=MemberState.ALIVE).order_by("id"))

    def lose(self, member: Member) -> bool:
        """The active master removes a member (its session is ended, as for a dead worker)."""
        removed = membership.remove_member(self.epoch, member.id, "lost in a test")
        session = self.sessions.pop(member.id, None)
        if session:
            session.close()
        return removed

    def leave(self, member: Member) -> bool:
        """The member stops itself (SIGTERM: a pod restart)."""
        left = membership.leave(member.id)
        session = self.sessions.pop(member.id, None)
        if session:
            session.close()
        return left

    def redeliver_loss(self, member: Member) -> None:
        """Deliver the member-removed event once more, as a duplicate would arrive."""
        member.refresh_from_db()
        with transaction.atomic():
            sequence = ClusterState.objects.get(id=1).member_event_sequence
            dirty.on_member_lost(member, sequence, None).append()

    # -- the master's steps ----------------------------------------------------------------

    def submit(self, threshold: int = 2, retries: int = 5, config: str | None = None) -> Job:
        text = config or TWO_PIPELINES.format(threshold=threshold, retries=retries)
        return submit_job(text)

    def schedule(self) -> None:
        while schedule_next(self.epoch):
            pass

    def run_deployed(self) -> None:
        """Every member reports RUNNING for what it was given."""
        for group in (
            TaskGroup.objects.on_alive_members()
            .filter(status=ExecutionStatus.DEPLOYING)
            .order_by("id")
        ):
            lifecycle.mark_running(group.id, group.attempt, group.member_id)

    def fail_lost(self) -> None:
        while orchestration.fail_lost_task_groups(self.epoch):
            pass

    def restore_due(self) -> list[str]:
        """Run every pending restore step now (as the control queue would)."""
        results = []
        for step in ControlStep.objects.filter(state=ControlStepState.PENDING).order_by("id"):
            results.append(recovery.restore_pipeline(step, self.epoch)[0])
        return results

    def stop_failing(self) -> None:
        """Members act on the cancel commands (engine.master.orchestration.CancelSender): the
        task groups of stopping jobs and of FAILING pipelines end CANCELED."""
        for group in TaskGroup.objects.stopping().order_by("id"):
            lifecycle.finish_task_group(
                group.id, group.attempt, group.member_id, ExecutionStatus.CANCELED
            )

    def settle(self) -> None:
        """Members lost -> groups failed -> restores -> RUNNING, until nothing changes."""
        for _ in range(10):
            self.fail_lost()
            self.stop_failing()
            results = self.restore_due()
            self.run_deployed()
            if not any(r == "restored" for r in results):
                return

    def new_master(self) -> int:
        """Another master takes over (epoch + 1) and reconciles before scheduling anything."""
        self.epoch += 1
        MasterLease.objects.filter(id=1).update(epoch=self.epoch)
        return orchestration.reconcile(self.epoch)

    def ordinary_failure(self, job: Job) -> None:
        """A reader fails on its own (a connector error): no member is lost."""
        group = TaskGroup.objects.filter(
            job=job, kind="READER", status=ExecutionStatus.RUNNING
        ).first()
        lifecycle.finish_task_group(
            group.id, group.attempt, group.member_id, ExecutionStatus.FAILED, "sink error"
        )

    def cancel(self, job: Job) -> None:
        cancel_job(job.id)
        self.stop_failing()

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    def summary(job: Job) -> dict:
        return dirty.job_summary(Job.objects.get(id=job.id))

    @staticmethod
    def state(job: Job) -> DirtyJobState | None:
        return DirtyJobState.objects.filter(job_id=job.id).first()

    @staticmethod
    def running(job: Job) -> bool:
        job = Job.objects.get(id=job.id)
        return job.status == JobStatus.RUNNING and all(
            p.status == ExecutionStatus.RUNNING for p in Pipeline.objects.filter(job=job)
        )

    @staticmethod
    def members_of(job: Job) -> set[int]:
        return set(TaskGroup.objects.filter(job=job).deployed().values_list("member_id", flat=True))
