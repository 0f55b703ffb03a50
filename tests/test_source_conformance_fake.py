"""FakeSource's managed reader passes the managed Source conformance suite."""

from __future__ import annotations

import pytest

from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader
from engine.jobs.planner import plan_job
from tests.source_conformance import *  # noqa: F403 - the suite's tests run for this connector
from tests.source_conformance import Subject


@pytest.fixture
def managed():
    plan = plan_job("source { FakeSource { row.num = 40, split.num = 3 } }\nsink { Blackhole {} }")
    node = plan.pipelines[0].source
    source = FakeSource(node.config, node.path)
    return Subject(
        make=lambda: ManagedFakeReader(source),
        splits=source.create_splits("BATCH"),
        rows_per_split=40,
        capability=CAPABILITY,
    )
