"""Chaos (``pytest -m chaos`` runs it alone): one streaming job writing a keyless Jdbc target
with two-phase commits and, per fault, one batch job (through the staging table), through each
fault in turn: kill -9 a worker; SIGSTOP a worker past the heartbeat timeout, then SIGCONT;
kill -9 the active master twice; stop Redis for 10 s; restart PostgreSQL (a private server).
After each, every source row is in its target exactly once, no pipeline is stuck and no slot
leaked."""

from __future__ import annotations

import pytest

from tests.chaoskit import FAULTS, chaos_cluster, describe

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]


def test_every_fault_in_turn_loses_and_duplicates_nothing():
    outcomes = []
    with chaos_cluster() as chaos:
        for name, fault in FAULTS.items():
            outcome = chaos.run(name, fault)
            outcomes.append(outcome)
            print(describe(outcome))
            assert outcome.clean, describe(outcome)
    assert [o.fault for o in outcomes] == list(FAULTS)
