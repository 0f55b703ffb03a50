"""Dirty-job tracking (seed 000) on real PostgreSQL, driven through the engine's own steps.

These tests cover the seed's acceptance criteria at the level of the state transitions (every
interleaving we choose, exactly); tests/test_dirty_cluster.py shows the same on a live cluster
with kill -9. The hypothesis state machine at the end checks the counts against a reference
model under random losses, duplicates, failed deployments, ordinary failures and master changes.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine import dirty
from engine.models import (
    DirtyJobState,
    DirtyTrackingGap,
    EngineEvent,
    Job,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from history.models import JobHistory
from tests.enginekit import Engine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.close()


def running_job(e: Engine, members: int = 3, **submit) -> tuple[object, list]:
    """A running two-pipeline job on two members (each hosts a task group of both pipelines),
    then ``members - 2`` more members with free slots to restore onto."""
    hosts = [e.add_member() for _ in range(2)]
    job = e.submit(**submit)
    e.schedule()
    e.run_deployed()
    assert e.running(job)
    hosts += [e.add_member() for _ in range(members - 2)]
    return job, hosts


def host_of_both_pipelines(e: Engine, job) -> object:
    """A member that runs a task group of every pipeline of the job."""
    for member in e.alive():
        pipelines = set(
            TaskGroup.objects.filter(job=job, member=member, status="RUNNING").values_list(
                "pipeline_id", flat=True
            )
        )
        if len(pipelines) == Pipeline.objects.filter(job=job).count():
            return member
    raise AssertionError("no member hosts every pipeline")


def attempts(job) -> list[tuple[str, str]]:
    return list(
        RecoveryAttempt.objects.filter(job=job).order_by("id").values_list("attempt_id", "state")
    )


def kinds(job, kind: str) -> int:
    return EngineEvent.objects.filter(job_id=job.id, kind=kind).count()


class Fault:
    """Real failures of the tracking store: a trigger that rejects writes for chosen jobs."""

    def __init__(self) -> None:
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS test_dirty_fault (job_id bigint, tbl text)")
            cur.execute(
                """
                CREATE OR REPLACE FUNCTION test_dirty_fault() RETURNS trigger AS $$
                BEGIN
                  IF EXISTS (SELECT 1 FROM test_dirty_fault
                              WHERE job_id = NEW.job_id AND tbl = TG_TABLE_NAME) THEN
                    RAISE EXCEPTION 'injected tracking-store failure for job %', NEW.job_id;
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql
                """
            )
            for table in ("engine_dirtyjobstate", "engine_recoveryattempt"):
                cur.execute(
                    f"CREATE OR REPLACE TRIGGER test_dirty_fault BEFORE UPDATE ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION test_dirty_fault()"
                )

    def on(self, job, table: str = "engine_dirtyjobstate") -> None:
        with connection.cursor() as cur:
            cur.execute("INSERT INTO test_dirty_fault VALUES (%s, %s)", [job.id, table])

    def off(self) -> None:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM test_dirty_fault")


@pytest.fixture
def fault():
    f = Fault()
    yield f
    with connection.cursor() as cur:
        cur.execute("DROP TABLE test_dirty_fault CASCADE")
        cur.execute("DROP TRIGGER test_dirty_fault ON engine_dirtyjobstate")
        cur.execute("DROP TRIGGER test_dirty_fault ON engine_recoveryattempt")
        cur.execute("DROP FUNCTION test_dirty_fault")


# -- the seed's acceptance criteria, at the level of state transitions -----------------------


def test_one_loss_affecting_two_pipelines_counts_one_first_generation_attempt(engine):
    job, _ = running_job(engine)
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    # Registered in the removal itself, before any task group was failed.
    assert MemberLossIncident.objects.filter(job=job).count() == 1
    assert TaskGroup.objects.filter(job=job, member=victim, status="RUNNING").count() == 2
    engine.settle()
    assert engine.running(job)
    assert sorted(attempts(job)) == sorted(
        [
            (f"{a.episode_id}-{a.pipeline.index}-1", "CONFIRMED")
            for a in RecoveryAttempt.objects.all()
        ]
    )
    assert len(attempts(job)) == 2
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.status, episode.generation) == ("COMPLETED", 1)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["recoveryEpisodeCount"] == 1
    assert s["memberLossIncidentCount"] == 1 and s["evaluationStatus"] == "CLEAN"
    assert s["lastLostMemberUuid"] == str(victim.uuid) and s["lastLostAddress"] == victim.address
    assert s["activeEpisodeId"] is None and s["lastCountedTime"] is not None


def test_a_second_deployment_attempt_advances_the_count_exactly_once(engine):
    job, _ = running_job(engine, members=4, threshold=2)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    assert engine.restore_due() == ["restored", "restored"]  # DEPLOYING: generation 1, count 1
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    # The redeployment fails: its member is lost before the task groups run.
    second = TaskGroup.objects.filter(job=job, status="DEPLOYING").first().member
    engine.lose(second)
    engine.settle()
    assert engine.running(job)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 2 and s["recoveryEpisodeCount"] == 1
    assert s["memberLossIncidentCount"] == 2
    assert s["dirty"] and s["evaluationStatus"] == "DIRTY" and s["firstDirtyTime"]
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.status, episode.generation) == ("COMPLETED", 2)
    assert kinds(job, "dirty.marked") == 1
    # Sequences are per pipeline: the pipelines the second loss hit have a -2 attempt.
    assert {a for a, _ in attempts(job) if a.endswith("-2")}
    assert all(state == "CONFIRMED" for _, state in attempts(job))


def test_duplicate_member_removed_and_duplicate_confirmation_are_no_ops(engine):
    job, _ = running_job(engine)
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    engine.redeliver_loss(victim)  # the same member-removed event, delivered again
    assert not engine.lose(victim)  # and the removal itself happens once only
    engine.settle()
    before = (engine.summary(job), attempts(job), EngineEvent.objects.count())
    engine.redeliver_loss(victim)
    from django.db import transaction

    for pipeline in Pipeline.objects.filter(job=job):
        with transaction.atomic():
            assert dirty.on_restore_deploying(Job.objects.get(id=job.id), pipeline, 1, 1) == []
    assert (engine.summary(job), attempts(job), EngineEvent.objects.count()) == before
    assert engine.summary(job)["memberLossIncidentCount"] == 1
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_ordinary_task_failures_are_not_counted(engine):
    job, _ = running_job(engine)
    engine.ordinary_failure(job)
    engine.stop_failing()
    job.refresh_from_db()
    assert job.status == "FAILED"
    assert not RecoveryEpisode.objects.filter(job=job).exists()
    s = engine.summary(job)  # from history now
    assert s["recoveryAttemptCount"] == 0 and s["evaluationStatus"] == "CLEAN"


def test_restore_preparation_without_deploying_is_not_counted(engine):
    job, _ = running_job(engine, members=2)  # 8 slots: after a loss only 4 remain
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    engine.fail_lost()
    engine.stop_failing()
    other_job = engine.submit(threshold=-1)  # takes the 4 left before the restore runs
    engine.schedule()
    assert set(engine.restore_due()) <= {"waiting for slots", "obsolete"}
    assert {state for _, state in attempts(job)} == {"PREPARED"}
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 0 and s["activeEpisodeId"] is not None
    # The job ends before it could redeploy: the episode aborts, nothing was counted.
    engine.cancel(job)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 0 and s["activeEpisodeId"] is None
    history = JobHistory.objects.get(job=job)
    assert history.episodes[0]["status"] == "ABORTED"
    assert {a["state"] for a in history.episodes[0]["attempts"]} == {"ABORTED"}
    assert other_job.dirty_threshold == -1


def test_a_completed_episode_is_not_consumed_by_a_later_ordinary_failure(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    engine.ordinary_failure(job)
    engine.stop_failing()
    assert Job.objects.get(id=job.id).status == "FAILED"  # no restore, no attempt
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["recoveryEpisodeCount"] == 1
    history = JobHistory.objects.get(job=job)
    assert [e["status"] for e in history.episodes] == ["COMPLETED"]


def test_a_member_that_stops_itself_is_unclassified_and_counted_after_deployment(engine):
    """A pod restart: the member leaves on SIGTERM, with no trusted planned-leave intent."""
    job, _ = running_job(engine)
    leaver = host_of_both_pipelines(engine, job)
    engine.leave(leaver)
    incident = MemberLossIncident.objects.get(job=job)
    assert incident.classification == "UNCLASSIFIED"
    assert engine.summary(job)["recoveryAttemptCount"] == 0  # not before deployment
    engine.settle()
    s = engine.summary(job)
    assert s["lastLeaveClassification"] == "UNCLASSIFIED" and s["recoveryAttemptCount"] == 1
    assert RecoveryEpisode.objects.get(job=job).classification == "UNCLASSIFIED"


def test_master_change_before_confirmation_keeps_the_binding(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    assert engine.new_master() == 0  # pre-deployment: kept, nothing to confirm yet
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    engine.settle()
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    assert engine.new_master() == 0  # and again after: no duplicate
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_master_change_during_confirmation_confirms_once(engine, fault):
    """The confirmation did not commit with the redeployment (a tracker-store failure at that
    instant): the next master's reconciliation confirms the original attempt id, once."""
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    fault.on(job, "engine_recoveryattempt")
    assert engine.restore_due() == ["restored", "restored"]  # recovery is not blocked
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    assert kinds(job, "dirty.tracker-failed") == 2
    # Until it is repaired the job is not CLEAN: the count is behind the truth.
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and "confirmation" in s["incompleteReason"]
    fault.off()
    ids = [a for a, _ in attempts(job)]
    assert engine.new_master() == 2
    assert attempts(job) == [(a, "CONFIRMED") for a in ids]
    engine.run_deployed()
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["evaluationStatus"] == "CLEAN"
    assert engine.new_master() == 0
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"


def test_reconciliation_of_an_unexplained_attempt_is_unknown(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    attempt = RecoveryAttempt.objects.filter(job=job).first()
    Pipeline.objects.filter(id=attempt.pipeline_id).update(status="CREATED")  # unexplainable
    engine.new_master()
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    assert "PREPARED" in s["incompleteReason"]


def test_missing_state_lagging_watermark_and_tracker_failure_are_unknown(engine, fault):
    job, _ = running_job(engine)
    healthy = engine.submit(threshold=2)
    engine.schedule()
    engine.run_deployed()
    assert engine.summary(job)["evaluationStatus"] == "CLEAN"
    # A tracker failure during a member loss: the loss is handled (the job restores) but this
    # job's watermark stays behind: UNKNOWN for ever, never CLEAN; the other job is unaffected.
    fault.on(job)
    engine.lose(host_of_both_pipelines(engine, job))
    fault.off()
    assert kinds(job, "dirty.tracker-failed") == 1
    assert DirtyTrackingGap.objects.get(job=job).member_event_sequence == (
        dirty.Sequences.read(job.id).member_event
    )
    engine.settle()
    assert engine.running(job)
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    assert "member event" in s["incompleteReason"]
    assert engine.summary(healthy)["evaluationStatus"] in ("CLEAN", "DIRTY")
    assert engine.summary(healthy)["trackingComplete"]
    # A later member event does not hide the lag.
    engine.lose(engine.add_member())
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    # A missing state is UNKNOWN too (never a clean default).
    DirtyJobState.objects.filter(job_id=healthy.id).delete()
    s = engine.summary(healthy)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    # A state row of a newer layout than this engine reads is UNKNOWN as well.
    third = engine.submit(threshold=2)
    DirtyJobState.objects.filter(job_id=third.id).update(schema_version=dirty.SCHEMA_VERSION + 1)
    assert engine.summary(third)["evaluationStatus"] == "UNKNOWN"
    # And the list annotation (REST lists and filters) agrees with every one of these.
    for j in (job, healthy, third):
        annotated = dirty.annotate(Job.objects.filter(id=j.id)).get()
        assert annotated.dirty_evaluation == engine.summary(j)["evaluationStatus"]


def test_reaching_the_threshold_changes_neither_status_nor_retries(engine):
    job, _ = running_job(engine, members=5, threshold=1, retries=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert engine.running(job) and engine.summary(job)["evaluationStatus"] == "DIRTY"
    # job.retry.times = 1 is still the restore limit: the next loss fails the job.
    engine.lose(next(m for m in engine.alive() if m.id in engine.members_of(job)))
    engine.settle()
    job.refresh_from_db()
    assert job.status == "FAILED" and "job.retry.times = 1" in job.error_msg
    assert engine.summary(job)["dirty"] is True  # irreversible, and kept in history


def test_running_and_finished_jobs_expose_the_same_summary(engine):
    job, _ = running_job(engine, threshold=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    running = engine.summary(job)
    episodes = dirty.job_episodes(Job.objects.get(id=job.id))
    engine.cancel(job)
    assert Job.objects.get(id=job.id).status == "CANCELED"
    assert engine.summary(job) == running
    assert dirty.job_episodes(Job.objects.get(id=job.id)) == episodes
    # The running state is gone, only after the history was written.
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    assert not RecoveryEpisode.objects.filter(job=job).exists()
    assert JobHistory.objects.get(job=job).dirty_task == running


def test_disabled_by_default_and_old_finished_records_read_as_disabled(engine):
    job, _ = running_job(engine, threshold=-1)
    assert not DirtyJobState.objects.exists()
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert not MemberLossIncident.objects.exists() and not RecoveryEpisode.objects.exists()
    assert engine.summary(job) == {"evaluationStatus": "DISABLED", "dirty": False}
    # A finished job recorded before the history record existed (no row at all), and one
    # whose record has no dirty summary: both read as DISABLED, other fields untouched.
    engine.cancel(job)
    JobHistory.objects.filter(job=job).delete()
    assert engine.summary(job) == {"evaluationStatus": "DISABLED", "dirty": False}
    assert dirty.job_episodes(Job.objects.get(id=job.id)) == []
    annotated = dirty.annotate(Job.objects.filter(id=job.id)).get()
    assert annotated.dirty_evaluation == "DISABLED"


def test_stale_episodes_expire_after_the_pending_incident_ttl(engine, settings):
    settings.ENGINE = {**settings.ENGINE, "dirty-task.pending-incident-ttl": 0.0}
    job, _ = running_job(engine)
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)  # the incident is registered; nothing was prepared yet
    episode = RecoveryEpisode.objects.get(job=job)
    # An episode whose restore is prepared and still waiting to deploy is not stale.
    engine.fail_lost()
    engine.stop_failing()
    assert not dirty.expire_stale_episodes(engine.epoch)
    # Restores no longer possible (the job's pipelines are gone): it expires.
    RecoveryAttempt.objects.filter(job=job).delete()
    assert dirty.expire_stale_episodes(engine.epoch)
    episode.refresh_from_db()
    assert episode.status == "ABORTED" and "expired" in episode.end_reason
    assert engine.summary(job)["activeEpisodeId"] is None


def test_member_removal_costs_the_same_statements_for_10_or_60_jobs(engine):
    """Bounded: a member loss is a constant number of statements, whatever the job count."""
    hosts = [engine.add_member(slots=80) for _ in range(2)]

    def removal_statements(jobs: int) -> int:
        for _ in range(jobs):
            engine.submit(threshold=3)
        engine.schedule()
        engine.run_deployed()
        victim = engine.add_member(slots=0)
        with CaptureQueriesContext(connection) as ctx:
            engine.lose(victim)
        return len(ctx.captured_queries)

    few = removal_statements(10)
    many = removal_statements(50)
    assert few == many
    # Every job handled every event: the shared watermark is up to date and no job has a gap.
    assert not DirtyTrackingGap.objects.exists()
    for job_id in DirtyJobState.objects.values_list("job_id", flat=True):
        assert not dirty.Sequences.read(job_id).lagging
    # Affected jobs too: losing a host of dozens of jobs is still one batch.
    affected = set(
        TaskGroup.objects.filter(member=hosts[0], status="RUNNING").values_list("job_id", flat=True)
    )
    assert len(affected) >= 30
    with CaptureQueriesContext(connection) as ctx:
        engine.lose(hosts[0])
    assert len(ctx.captured_queries) <= few + 10
    assert set(MemberLossIncident.objects.values_list("job_id", flat=True)) == affected


def test_history_keeps_the_configured_number_of_episodes(engine, settings):
    settings.ENGINE = {**settings.ENGINE, "dirty-task.event-history-size": 2}
    job, _ = running_job(engine, members=6, threshold=10, retries=10)
    for _ in range(3):
        engine.lose(next(m for m in engine.alive() if m.id in engine.members_of(job)))
        engine.settle()
        assert engine.running(job)
    s = engine.summary(job)
    assert s["recoveryEpisodeCount"] == 3 and s["recoveryAttemptCount"] == 3
    assert len(dirty.job_episodes(Job.objects.get(id=job.id))) == 2


# -- random interleavings against a reference model ------------------------------------------


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


# -- the REST contract ---------------------------------------------------------------------


@pytest.fixture
def api():
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    user = get_user_model().objects.create_user("dirty-operator", password="x-Very-long-pass-9")
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_rest_fields_filters_and_episodes(engine, api):
    dirty_job, _ = running_job(engine, members=4, threshold=1)
    clean_job = engine.submit(threshold=5)
    disabled_job = engine.submit(threshold=-1)
    engine.schedule()
    engine.run_deployed()
    engine.lose(host_of_both_pipelines(engine, dirty_job))
    engine.settle()

    detail = api.get(f"/api/v1/jobs/{dirty_job.id}").json()["dirtyTask"]
    assert set(detail) >= {
        "dirty",
        "evaluationStatus",
        "trackingComplete",
        "threshold",
        "recoveryAttemptCount",
        "recoveryEpisodeCount",
        "memberLossIncidentCount",
        "activeEpisodeId",
        "lastLeaveClassification",
        "lastLostMemberUuid",
        "lastLostAddress",
        "lastCountedTime",
        "firstDirtyTime",
    }
    assert detail["evaluationStatus"] == "DIRTY" and detail["threshold"] == 1
    assert api.get(f"/api/v1/jobs/{disabled_job.id}").json()["dirtyTask"] == {
        "evaluationStatus": "DISABLED",
        "dirty": False,
    }

    def ids(query: str) -> set[int]:
        response = api.get(f"/api/v1/jobs?{query}")
        assert response.status_code == 200, response.json()
        return {j["jobId"] for j in response.json()["results"]}

    assert ids("dirty=true") == {dirty_job.id}
    assert ids("dirty=false") == {clean_job.id, disabled_job.id}
    assert ids("evaluationStatus=DIRTY") == {dirty_job.id}
    assert ids("evaluationStatus=CLEAN") == {clean_job.id}
    assert ids("evaluationStatus=DISABLED") == {disabled_job.id}
    assert ids("evaluationStatus=UNKNOWN") == set()
    listed = {j["jobId"]: j["dirtyTask"] for j in api.get("/api/v1/jobs").json()["results"]}
    assert listed[dirty_job.id] == {
        "dirty": True,
        "evaluationStatus": "DIRTY",
        "recoveryAttemptCount": 1,
    }
    assert listed[disabled_job.id] == {"evaluationStatus": "DISABLED", "dirty": False}
    bad = api.get("/api/v1/jobs?evaluationStatus=MAYBE")
    assert bad.status_code == 400 and "evaluationStatus" in str(bad.json())

    [episode] = api.get(f"/api/v1/jobs/{dirty_job.id}/episodes").json()
    assert set(episode) >= {
        "episodeId",
        "status",
        "startedAt",
        "endedAt",
        "generation",
        "classification",
        "incidents",
        "attempts",
    }
    assert episode["status"] == "COMPLETED" and episode["generation"] == 1
    assert set(episode["incidents"][0]) >= {"lostMemberUuid", "lostAddress", "classification", "at"}
    assert set(episode["attempts"][0]) >= {
        "attemptId",
        "pipelineId",
        "prepareSequence",
        "state",
        "at",
    }
    assert api.get("/api/v1/jobs/999999/episodes").status_code == 404
    assert api.get(f"/api/v1/jobs/{disabled_job.id}/episodes").json() == []


def test_every_api_route_needs_authentication():
    """Every route of the API, new ones included, refuses an anonymous caller."""
    from django.urls import URLPattern
    from rest_framework.test import APIClient

    from engine.api.urls import urlpatterns

    client = APIClient()
    for pattern in urlpatterns:
        assert isinstance(pattern, URLPattern)
        path = "/api/v1/" + str(pattern.pattern).replace("<int:job_id>", "1")
        assert client.get(path).status_code in (401, 403), path


def test_enabling_is_refused_while_an_older_member_is_alive(engine, api):
    from engine.models import Member

    old = engine.add_member()
    Member.objects.filter(id=old.id).update(protocol_version=1)
    config = engine_config(threshold=2)
    response = api.post("/api/v1/jobs", {"config": config}, format="json")
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["path"] == "env.job.dirty-task.threshold"
    assert old.name in error["message"] and "protocol 1" in error["message"]
    assert not Job.objects.exists()  # nothing was created
    assert (
        api.post("/api/v1/jobs", {"config": engine_config(threshold=-1)}, format="json").status_code
        == 201
    )
    engine.lose(old)
    assert api.post("/api/v1/jobs", {"config": config}, format="json").status_code == 201


def engine_config(threshold: int) -> str:
    from tests.enginekit import TWO_PIPELINES

    return TWO_PIPELINES.format(threshold=threshold, retries=3)


def test_a_failed_history_snapshot_keeps_dirty_and_is_written_later(engine):
    """The job's end is never blocked, DIRTY is never lost: the running state stays until the
    reconciliation writes the snapshot."""
    job, _ = running_job(engine, threshold=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    running = engine.summary(job)
    assert running["evaluationStatus"] == "DIRTY"
    with connection.cursor() as cur:
        cur.execute(
            """
            CREATE FUNCTION test_history_fault() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'injected history failure'; END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_history_fault BEFORE INSERT ON history_jobhistory
               FOR EACH ROW EXECUTE FUNCTION test_history_fault();
            """
        )
    try:
        engine.cancel(job)
        assert Job.objects.get(id=job.id).status == "CANCELED"
        assert not JobHistory.objects.filter(job=job).exists()
        finished = engine.summary(job)
        assert finished["dirty"] and finished["recoveryAttemptCount"] == 1
        assert dirty.annotate(Job.objects.filter(id=job.id)).get().dirty_evaluation == "DIRTY"
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER test_history_fault ON history_jobhistory")
            cur.execute("DROP FUNCTION test_history_fault")
    engine.new_master()
    assert JobHistory.objects.get(job=job).dirty_task["dirty"] is True
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    assert engine.summary(job) == {**running, "activeEpisodeId": None}


def test_a_member_event_nobody_handled_becomes_gaps_of_the_jobs_of_that_time(engine):
    """The shared watermark left behind (an older master ended a member without the tracker):
    the jobs tracked then are UNKNOWN for ever; jobs submitted afterwards are not."""
    job, _ = running_job(engine)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE engine_clusterstate SET member_event_sequence = member_event_sequence + 1"
        )
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    engine.new_master()
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    later = engine.submit(threshold=2)
    assert engine.summary(later)["evaluationStatus"] == "CLEAN"
    assert dirty.annotate(Job.objects.filter(id=job.id)).get().dirty_evaluation == "UNKNOWN"
    assert dirty.annotate(Job.objects.filter(id=later.id)).get().dirty_evaluation == "CLEAN"
    assert kinds_without_job("dirty.tracker-failed") == 1


def kinds_without_job(kind: str) -> int:
    return EngineEvent.objects.filter(job_id__isnull=True, kind=kind).count()


def test_one_job_failing_reconciliation_does_not_stop_the_others(engine, fault):
    first, _ = running_job(engine, members=2)
    second = engine.submit(threshold=2)  # on the same two members
    engine.schedule()
    engine.run_deployed()
    for _ in range(3):
        engine.add_member()
    victim = host_of_both_pipelines(engine, first)
    assert victim.id in engine.members_of(second)
    engine.lose(victim)
    engine.fail_lost()
    engine.stop_failing()
    fault.on(first, "engine_recoveryattempt")
    fault.on(second, "engine_recoveryattempt")
    engine.restore_due()  # both confirmations fail: both jobs have PREPARED attempts
    fault.off()
    fault.on(first, "engine_recoveryattempt")  # the first keeps failing
    engine.new_master()
    assert {s for _, s in attempts(second)} == {"CONFIRMED"}
    assert {s for _, s in attempts(first)} == {"PREPARED"}
    assert engine.summary(first)["evaluationStatus"] == "UNKNOWN"
    fault.off()
    engine.new_master()
    engine.run_deployed()
    engine.new_master()
    for job in (first, second):
        s = engine.summary(job)
        assert s["evaluationStatus"] == "CLEAN", s
        assert s["recoveryAttemptCount"] == 1


def test_an_obsolete_restore_aborts_its_attempt(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    from engine.models import Pipeline as P

    pipeline = P.objects.filter(job=job).order_by("index").first()
    P.objects.filter(id=pipeline.id).update(status="FAILED")  # it will never restore
    engine.restore_due()
    states = dict(RecoveryAttempt.objects.filter(job=job).values_list("pipeline_id", "state"))
    assert states[pipeline.id] == "ABORTED"
    assert engine.summary(job)["recoveryAttemptCount"] == 1  # the other pipeline deployed


def test_dashboard_filters_by_recovery_label_and_shows_episodes(engine, client):
    from django.contrib.auth import get_user_model

    dirty_job, _ = running_job(engine, members=4, threshold=1)
    clean_job = engine.submit(threshold=5)
    engine.schedule()
    engine.run_deployed()
    engine.lose(host_of_both_pipelines(engine, dirty_job))
    engine.settle()
    assert client.get(f"/jobs/{dirty_job.id}").status_code == 302  # login first
    user = get_user_model().objects.create_user("watcher", password="x-Very-long-pass-7")
    client.force_login(user)

    page = client.get("/?recovery=DIRTY").content.decode()
    assert f'href="/jobs/{dirty_job.id}"' in page
    assert f'href="/jobs/{clean_job.id}"' not in page
    assert 'hx-get="/?recovery=DIRTY"' in page  # the live refresh keeps the filter
    everything = client.get("/?recovery=whatever").content.decode()
    assert f'href="/jobs/{clean_job.id}"' in everything

    detail = client.get(f"/jobs/{dirty_job.id}").content.decode()
    attempt = RecoveryAttempt.objects.filter(job=dirty_job).first()
    assert "DIRTY" in detail and attempt.attempt_id in detail and "COMPLETED" in detail
    partial = client.get(f"/jobs/{dirty_job.id}", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and attempt.attempt_id in partial
    assert client.get("/jobs/999999").status_code == 404
