"""Dirty-job tracking on real PostgreSQL against a reference model: a hypothesis state machine
drives the engine through random losses, duplicates, failed deployments, ordinary failures and
master changes, and checks the counts against the model's after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine import dirty
from engine.models import (
    DirtyJobState,
    Job,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from tests.enginekit import Engine

pytestmark = pytest.mark.django_db(transaction=True)


class DirtyModel(RuleBasedStateMachine):
    """Random member losses (crash or leave), duplicate deliveries, failed deployments (a loss
    while the redeployment is still DEPLOYING), ordinary failures and master changes; after
    every step the engine's counts equal the reference model's."""

    def __init__(self) -> None:
        super().__init__()
        for model in (Job, DirtyJobState, MemberLossIncident, RecoveryEpisode):
            model.objects.all().delete()
        self.e = Engine()
        for _ in range(4):
            self.e.add_member()
        self.job = self.e.submit(threshold=3, retries=100)
        self.e.schedule()
        self.e.run_deployed()
        # The model: one episode at a time, per-pipeline sequences, generation, count.
        self.count = self.episodes = self.incidents = 0
        self.active = False
        self.sequences: dict[int, int] = {}
        self.generation = 0
        self.restores = self._restores()
        self.lost: list = []

    def teardown(self) -> None:
        self.e.close()

    def _restores(self) -> dict[int, int]:
        return dict(Pipeline.objects.filter(job=self.job).values_list("id", "restore_count"))

    def _job_running(self) -> bool:
        return Job.objects.get(id=self.job.id).status in ("RUNNING", "SCHEDULED")

    def _observe_restores(self) -> None:
        """Each restore the engine deployed is one attempt of its pipeline (model update)."""
        now = self._restores()
        for pipeline, count in sorted(now.items()):
            for _ in range(count - self.restores[pipeline]):
                self.sequences[pipeline] = self.sequences.get(pipeline, 0) + 1
                if self.sequences[pipeline] > self.generation:
                    self.generation = self.sequences[pipeline]
                    self.count += 1
        self.restores = now
        if self.active and self.e.running(self.job) and self.generation > 0:
            self.active, self.sequences, self.generation = False, {}, 0

    def _lose(self, crash: bool) -> None:
        hosts = self.e.members_of(self.job)
        victim = next(m for m in self.e.alive() if m.id in hosts)
        if not self.active:
            self.active, self.episodes = True, self.episodes + 1
        self.incidents += 1
        (self.e.lose if crash else self.e.leave)(victim)
        self.lost.append(victim)
        if len(self.e.alive()) < 4:
            self.e.add_member()

    @precondition(lambda self: self._job_running())
    @rule(crash=st.booleans())
    def lose_a_host_and_recover(self, crash):
        self._lose(crash)
        self.e.settle()
        self._observe_restores()

    @precondition(lambda self: self._job_running())
    @rule(crash=st.booleans())
    def lose_a_host_while_redeploying(self, crash):
        """The first redeployment fails: its member is lost before it runs."""
        self._lose(crash)
        self.e.fail_lost()
        self.e.stop_failing()
        self.e.restore_due()
        self._observe_restores()
        if TaskGroup.objects.filter(job=self.job, status="DEPLOYING").exists():
            self._lose(crash)
        self.e.settle()
        self._observe_restores()

    @precondition(lambda self: self.lost)
    @rule(data=st.data())
    def duplicate_member_removed(self, data):
        self.e.redeliver_loss(data.draw(st.sampled_from(self.lost)))

    @rule()
    def duplicate_confirmations(self):
        from django.db import transaction

        for attempt in RecoveryAttempt.objects.filter(job=self.job).select_related("pipeline"):
            with transaction.atomic():
                job = Job.objects.select_for_update().get(id=self.job.id)
                dirty.on_restore_deploying(job, attempt.pipeline, attempt.restore_number, None)

    @rule()
    def master_change(self):
        self.e.new_master()

    @precondition(lambda self: self._job_running())
    @rule()
    def unrelated_member_lost(self):
        self.e.lose(self.e.add_member())  # hosts nothing of the job: no incident

    @precondition(lambda self: self._job_running() and not self.active)
    @rule()
    def ordinary_failure_ends_the_job(self):
        self.e.ordinary_failure(self.job)
        self.e.stop_failing()

    @invariant()
    def counts_agree(self):
        s = self.e.summary(self.job)
        assert s["recoveryAttemptCount"] == self.count, (s, self.count)
        assert s["recoveryEpisodeCount"] == self.episodes
        assert s["memberLossIncidentCount"] == self.incidents
        assert s["dirty"] == (self.count >= 3)
        assert s["evaluationStatus"] == ("DIRTY" if self.count >= 3 else "CLEAN")


DirtyModel.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.django_db(transaction=True)
class TestDirtyModel(DirtyModel.TestCase):
    pass
