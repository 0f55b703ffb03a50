from __future__ import annotations

import pytest

from tests.clusterkit import Cluster, DatabaseTemplate


@pytest.fixture(scope="session")
def db_template():
    template = DatabaseTemplate()
    yield template
    template.drop_all()


@pytest.fixture(scope="module")
def cluster(db_template):
    """A running cluster (2 masters, 2 workers, 8 fixed slots, 3 s heartbeat timeout) shared by
    a module's tests; each destructive test restores it with ``cluster.restore()`` first."""
    with Cluster(db_template, masters=2, workers=2, slots=8, heartbeat_timeout=3.0) as c:
        yield c


@pytest.fixture
def healthy(cluster):
    """The module cluster with every process running and an active master."""
    cluster.restore()
    from tests.clusterkit import wait_for

    wait_for(cluster.active_master, 10, what="an active master")
    return cluster


@pytest.fixture
def engine():
    """The engine's own steps on the test database (tests/enginekit.py), closed afterwards."""
    from tests.enginekit import Engine

    e = Engine()
    yield e
    e.close()


@pytest.fixture
def fault():
    """Injected failures of the dirty-job tracking store (tests/dirtykit.py), removed afterwards."""
    from tests.dirtykit import Fault

    with Fault() as f:
        yield f
