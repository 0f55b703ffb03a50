"""The job's env block as SeaTunnel writes it: the Flink starter's older ``execution.*``
spellings used under their common names (the common name winning a conflict, as in SeaTunnel),
other engines' and effect-less options warned about, and ``tag_filter`` placing a job only on
workers whose tags hold each of its pairs, on first scheduling and on every restore."""

from __future__ import annotations

import re

import pytest

from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.models import Job, Member, TaskGroup
from engine.states import JobStatus
from tests.conftest import role_user
from tests.test_seatunnel_rest import client_for

SINKS = """
source { FakeSource { plugin_output = fake, row.num = 5 } }
sink { Console { plugin_input = fake } }
"""

#: The env of SeaTunnel's outdated_env_param_fakesource_to_localfile.conf (its e2e test of the
#: Flink starter's older spellings), parallelism raised to tell it from the default.
OUTDATED = """
env {
  job.name = "FLINK_ENV_PARAM_OUTDATED"
  job.mode = "STREAMING"
  execution.time-characteristic = "ProcessingTime"
  execution.buffer.timeout = 100
  execution.parallelism = 2
  execution.max-parallelism = 5
  execution.checkpoint.interval = 7000
  execution.checkpoint.mode = "EXACTLY_ONCE"
  execution.checkpoint.timeout = 600000
  execution.checkpoint.min-pause = 100
  execution.max-concurrent-checkpoints = 2
  execution.restart.strategy = "fixed-delay"
  execution.restart.attempts = 2
  execution.state.backend = "rocksdb"
  execution.checkpoint.data-uri = "file:///tmp/seatunnel/flink/checkpoints/"
  execution.planner = blink
}
"""


def warned(plan) -> dict[str, str]:
    return {w["path"]: w["message"] for w in plan.warnings}


def test_the_flink_starters_older_spellings_set_the_common_options():
    plan = plan_job(OUTDATED + SINKS)
    assert (plan.parallelism, plan.pipelines[0].parallelism) == (2, 2)
    assert plan.env["checkpoint.interval"] == 7000
    assert plan.env["checkpoint.timeout"] == 600000
    assert "execution.parallelism" not in plan.env
    warnings = warned(plan)
    older = "its older spelling (SeaTunnel's Flink starter)"
    assert warnings["env.execution.parallelism"] == f"used as parallelism: {older}"
    assert warnings["env.execution.checkpoint.interval"] == f"used as checkpoint.interval: {older}"
    flink = "ignored: an option of Flink (the Flink starter's older spelling)"
    for key in (
        "time-characteristic",
        "buffer.timeout",
        "max-parallelism",
        "checkpoint.mode",
        "checkpoint.min-pause",
        "max-concurrent-checkpoints",
        "restart.strategy",
        "restart.attempts",
        "state.backend",
        "checkpoint.data-uri",
        "planner",
    ):
        assert warnings[f"env.execution.{key}"] == flink


def test_the_common_name_wins_over_its_older_spelling():
    env = "env { parallelism = 3, execution.parallelism = 1, checkpoint.interval = 5000, "
    env += "execution.checkpoint.interval = 100, job.mode = STREAMING }"
    plan = plan_job(env + SINKS)
    assert plan.parallelism == 3
    assert plan.env["checkpoint.interval"] == 5000
    assert warned(plan)["env.execution.parallelism"] == (
        "ignored: parallelism is set too and takes precedence (as in SeaTunnel)"
    )


def test_a_bad_value_under_an_older_spelling_names_the_key_written():
    with pytest.raises(ConfigError) as caught:
        plan_job("env { execution.parallelism = many }" + SINKS)
    assert caught.value.errors == [
        {"path": "env.execution.parallelism", "message": "must be an integer"}
    ]


def test_seatunnels_other_env_options_are_accepted_with_a_reason():
    env = """
    env {
      min-pause = 500
      pipeline_concurrency = 1
      custom_parameters { a = 1, b = "two" }
      job.retry.times = 0
      job.retry.interval.seconds = 1
    }
    """
    plan = plan_job(env + SINKS)
    assert (plan.env["job.retry.times"], plan.env["job.retry.interval.seconds"]) == (0, 1)
    assert set(warned(plan)) == {
        "env.min-pause",
        "env.pipeline_concurrency",
        "env.custom_parameters",
    }
    assert all(m.startswith("no effect: ") for m in warned(plan).values())


def test_tag_filter_is_kept_as_strings_and_a_bad_one_is_refused():
    plan = plan_job("env { tag_filter { group = platform, n = 1, on = true } }" + SINKS)
    assert plan.env["tag_filter"] == {"group": "platform", "n": "1", "on": "true"}
    assert "tag_filter" not in plan_job("env { tag_filter {} }" + SINKS).env
    for env, path in (
        ('env { tag_filter = "platform" }', "env.tag_filter"),
        ("env { tag_filter { group = [a, b] } }", "env.tag_filter.group"),
    ):
        with pytest.raises(ConfigError) as caught:
            plan_job(env + SINKS)
        assert [e["path"] for e in caught.value.errors] == [path]


TAGGED = """
env { job.mode = STREAMING, job.retry.interval.seconds = 0, tag_filter { group = platform } }
source { FakeSource { plugin_output = fake, rows.per-second = 10 } }
sink { Blackhole { plugin_input = fake } }
"""


@pytest.mark.django_db(transaction=True)
def test_a_tagged_job_runs_and_restores_only_on_matching_members(engine):
    plain = engine.add_member(slots=8)
    first = engine.add_member(slots=2, tags={"group": "platform", "team": "team1"})
    job = engine.submit(config=TAGGED)
    engine.schedule()
    engine.run_deployed()
    assert engine.running(job) and engine.members_of(job) == {first.id}
    engine.lose(first)
    engine.settle()
    # Slots are free on the untagged member, but the restore waits for a matching one.
    assert not engine.running(job)
    assert not TaskGroup.objects.filter(job=job, member=plain).exists()
    second = engine.add_member(slots=2, tags={"group": "platform"})
    engine.settle()
    assert engine.running(job) and engine.members_of(job) == {second.id}


@pytest.mark.django_db(transaction=True)
def test_draining_the_only_matching_member_is_refused_for_want_of_room(engine):
    from engine.jobs import drain

    engine.add_member(slots=8)  # room, but not for a job that wants tagged workers
    tagged = engine.add_member(slots=2, tags={"group": "platform"})
    job = engine.submit(config=TAGGED)
    engine.schedule()
    engine.run_deployed()
    assert engine.members_of(job) == {tagged.id}
    operator = role_user("olga", "operator")
    with pytest.raises(drain.DrainRefused, match=r"matching tag_filter \{group: platform\}"):
        drain.request_drain(tagged.uuid, operator, "kernel upgrade")
    engine.add_member(slots=2, tags={"group": "platform"})
    _, created = drain.request_drain(tagged.uuid, operator, "kernel upgrade")
    assert created


@pytest.mark.django_db(transaction=True)
def test_a_pending_job_whose_workers_are_gone_says_so(engine):
    engine.add_member(slots=8)
    tagged = engine.add_member(slots=2, tags={"group": "platform"})
    job = engine.submit(config=TAGGED)
    engine.lose(tagged)
    engine.schedule()
    job = Job.objects.get(id=job.id)
    assert job.status == JobStatus.PENDING
    assert job.pending_reason == "no live worker matches tag_filter {group: platform}"


@pytest.mark.django_db(transaction=True)
def test_the_cluster_page_shows_each_members_tags(engine, client):
    tagged = engine.add_member(slots=2, tags={"group": "platform", "team": "team1"})
    plain = engine.add_member(slots=2)
    client.force_login(role_user("vera", "viewer"))
    page = client.get("/").content.decode()
    for member, shown in (
        (tagged, "<code>group=platform</code> <code>team=team1</code>"),
        (plain, "-"),
    ):
        assert re.search(
            rf'data-member-uuid="{member.uuid}">.*?data-field="tags">{re.escape(shown)}</td>',
            page,
            re.S,
        )


@pytest.mark.django_db(transaction=True)
def test_a_job_no_live_worker_matches_is_refused_naming_the_filter(api, engine):
    engine.add_member(slots=8, tags={"group": "platform"})
    config = TAGGED.replace("group = platform", "group = error_tag, team = error_tag")
    response = api.post("/api/v1/jobs", {"config": config}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {
            "path": "env.tag_filter",
            "message": "no live worker matches tag_filter {group: error_tag, team: error_tag}",
        }
    ]
    assert Member.objects.get().tags == {"group": "platform"}


@pytest.mark.django_db(transaction=True)
def test_seatunnels_overview_counts_the_workers_its_tags_match(engine):
    engine.add_member(slots=8)
    engine.add_member(slots=2, tags={"group": "platform", "team": "team1"})
    viewer = client_for("viewer")
    whole = viewer.get("/overview").json()
    assert (whole["works"], whole["totalSlot"]) == ("2", "10")
    tagged = viewer.get("/overview", {"group": "platform"}).json()
    assert (tagged["works"], tagged["totalSlot"], tagged["unassignedSlot"]) == ("1", "2", "2")
    assert viewer.get("/overview", {"group": "other"}).json()["works"] == "0"
