"""Partitions (``pytest -m partition`` runs them alone): every master and worker on a test host
of its own (a network namespace), a streaming Jdbc job (keyless target, two-phase commits, a
checkpoint every 500 ms) and, per scenario, a batch job; each network fault in turn, then
every source row in its target exactly once, no pipeline stuck, no slot leaked, no deposed
master's write landed (tests/partitionkit.py). Needs root, ``ip netns`` and nftables."""

from __future__ import annotations

import pytest

from tests import netkit
from tests.chaoskit import describe

pytestmark = [pytest.mark.cluster, pytest.mark.partition]

REASON = netkit.available()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from tests.partitionkit import SCENARIOS, partition_cluster  # noqa: E402

#: Data flows again this soon after a partition heals (the engine notices a dead link in
#: seconds and reconnects within one: a half-open link left to TCP's backoff costs 10 s more).
FLOWS_AGAIN_WITHIN = 5.0


def test_primary_lost_and_a_synchronous_standby_promoted():
    """The engine's ``DATABASE_URL`` names both servers (libpq's multi-host form, read-write
    sessions only); the primary crashes and the standby is promoted: no row the test saw
    committed is lost, and the cluster carries on within the outage tolerance (30 s) with
    no restore."""
    from tests.standbykit import failover_cluster, lose_the_primary

    with failover_cluster() as f:
        removed = f.removals()
        outcome = f.run("primary lost, synchronous standby promoted", lose_the_primary)
        # A member that held nothing would cost no restore: none may be removed either.
        assert f.removals() == removed
    print(describe(outcome))
    assert outcome.clean, describe(outcome)
    assert outcome.restores == 0, describe(outcome)
    assert outcome.flows_again < 30, describe(outcome)


@pytest.fixture(scope="module")
def partitions():
    with partition_cluster() as p:
        yield p


@pytest.mark.parametrize("name", list(SCENARIOS), ids=[f.__name__ for f in SCENARIOS.values()])
def test_scenario(partitions, name):
    outcome = partitions.run(name, SCENARIOS[name])
    print(describe(outcome))
    assert outcome.clean, describe(outcome)
    assert outcome.flows_again < FLOWS_AGAIN_WITHIN, describe(outcome)
