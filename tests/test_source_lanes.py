"""Lanes: every connector runs in Lane B unless it declares a managed capability and is on the
allow-list while the kill switch is on; the lane and capability digest are recorded in the plan
and shown in job detail; a restore keeps the recorded lane and fails before execution when the
installed connector's capability digest differs."""

from __future__ import annotations

import pytest

from engine.connectors import get_plugin
from engine.connectors.fake import FakeSource
from engine.jobs.planner import PipelinePlan, plan_job
from engine.sourceruntime import (
    LEGACY,
    Lane,
    LaneMismatch,
    ManagedSourceCapability,
    SourceRuntime,
    check_restore,
    choose,
)

ON = {"source-runtime.managed-enabled": True, "source-runtime.managed-connectors": ["Pilot"]}


class Pilot:
    """A connector class as the registry holds them: a name, and a declared capability."""

    name = "Pilot"
    managed_capability = ManagedSourceCapability(async_enumerator=True)


class Plain:
    name = "Plain"


def test_lane_a_needs_the_allow_list_the_switch_and_a_capability():
    assert choose(Pilot, ON) == SourceRuntime(Lane.MANAGED, Pilot.managed_capability.digest)
    assert choose(Pilot, {**ON, "source-runtime.managed-enabled": False}) == LEGACY
    assert choose(Pilot, {**ON, "source-runtime.managed-connectors": []}) == LEGACY
    assert choose(Plain, {**ON, "source-runtime.managed-connectors": ["Plain"]}) == LEGACY


def test_the_digest_is_stable_and_changes_with_the_capability():
    assert ManagedSourceCapability().digest == ManagedSourceCapability().digest
    assert ManagedSourceCapability().digest != ManagedSourceCapability(source_events=True).digest


def test_a_restore_keeps_its_lane_whatever_the_switch_says_and_checks_the_digest():
    recorded = choose(Pilot, ON)
    assert check_restore(recorded, Pilot) == recorded
    assert check_restore(LEGACY, Pilot) == LEGACY  # never moved to Lane A either

    class Upgraded(Pilot):
        managed_capability = ManagedSourceCapability(async_enumerator=True, source_events=True)

    with pytest.raises(LaneMismatch, match="restore with a matching version"):
        check_restore(recorded, Upgraded)
    with pytest.raises(LaneMismatch, match="no managed capability"):
        check_restore(recorded, Plain)


def test_the_plan_records_the_lane_and_an_old_plan_reads_as_lane_b(settings):
    config = "source { FakeSource { } }\nsink { Blackhole { } }"
    # Not on the allow-list (empty by default): Lane B, whatever the connector declares.
    plan = plan_job(config)
    assert plan.pipelines[0].to_json()["sourceRuntime"] == {"lane": "B", "capabilityDigest": None}
    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": ["fakesource"]}
    digest = FakeSource.managed_capability.digest
    assert plan_job(config).pipelines[0].to_json()["sourceRuntime"] == {
        "lane": "A",
        "capabilityDigest": digest,
    }
    # Every other connector stays in Lane B even when allow-listed: it declares no capability.
    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": ["Jdbc"]}
    assert getattr(get_plugin("source", "Jdbc"), "managed_capability", None) is None
    old = plan.pipelines[0].to_json()
    del old["sourceRuntime"]
    assert PipelinePlan.from_json(old).source_runtime == LEGACY.to_json()


@pytest.mark.django_db
def test_job_detail_shows_each_pipeline_s_source_runtime():
    from engine.jobs.submission import submit_job
    from tests.conftest import role_user
    from tests.test_roles import client_for

    client = client_for(role_user("vera", "viewer"))
    job = submit_job("source { FakeSource { } }\nsink { Blackhole { } }")
    detail = client.get(f"/api/v1/jobs/{job.id}").json()
    assert detail["pipelines"][0]["sourceRuntime"] == {"lane": "B", "capabilityDigest": None}
