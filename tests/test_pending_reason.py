"""A job that can never fit: refused at submit, or, if the cluster shrank after it was
submitted, left PENDING with its reason while later jobs that fit go ahead of it."""

from __future__ import annotations

import pytest

from engine.jobconfig import ConfigError
from engine.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def config(parallelism: int, name: str) -> str:
    return (
        f'env {{ job.name = "{name}", parallelism = {parallelism} }}\n'
        "source { FakeSource { } }\nsink { Blackhole { } }\n"
    )


def test_a_job_bigger_than_the_cluster_is_refused_at_submit(engine):
    engine.add_member(slots=4)
    with pytest.raises(ConfigError) as refused:
        engine.submit(config=config(5, "big"))  # 1 pipeline x (5 readers + 1 enumerator)
    error = refused.value.errors[0]
    assert error["path"] == "env.parallelism"
    assert "needs 6 slots, the cluster has 4" in error["message"]
    assert not Job.objects.exists()


def test_after_the_cluster_shrank_it_waits_with_its_reason_and_blocks_nobody(engine, api):
    first = engine.add_member(slots=4)
    engine.add_member(slots=4)
    engine.submit(config=config(1, "holds two"))
    engine.schedule()  # the first job runs on 2 of the 8 slots
    big = engine.submit(config=config(5, "big"))  # 6 slots: fits 8 in all, 6 free now
    engine.lose(first)  # 4 slots left in the cluster
    small = engine.submit(config=config(1, "small"))
    engine.schedule()

    big.refresh_from_db()
    small.refresh_from_db()
    assert (big.status, big.pending_reason) == ("PENDING", "needs 6 slots, the cluster has 4")
    assert small.status == "SCHEDULED" and small.pending_reason == ""
    detail = api.get(f"/api/v1/jobs/{big.id}").json()
    assert detail["pendingReason"] == "needs 6 slots, the cluster has 4"

    engine.add_member(slots=4)  # the cluster grows back: the reason becomes waiting for slots
    engine.schedule()
    big.refresh_from_db()
    assert big.status == "PENDING"
    assert big.pending_reason.startswith("waiting for 6 free slots")
    engine.add_member(slots=4)
    engine.schedule()
    big.refresh_from_db()
    assert (big.status, big.pending_reason) == ("SCHEDULED", "")
