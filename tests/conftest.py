from __future__ import annotations

import os
import tempfile

import pytest

#: Tests write LocalFile data under the temporary directory: a file root for them (and for the
#: cluster processes they start, which inherit the environment). Boundary tests set their own.
TEST_FILE_ROOTS = os.pathsep.join(
    [str(os.path.realpath(tempfile.gettempdir())), ".var/data", "examples"]
)
os.environ["KEEL_CONNECTORS_FILE_ROOTS"] = TEST_FILE_ROOTS


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """The test database is this run's own (``test_keel_<pid>``): two runs on one server (two
    checkouts, a developer's run beside CI's) never create or drop each other's."""
    from django.conf import settings

    test = settings.DATABASES["default"].setdefault("TEST", {})
    test["NAME"] = f"test_{settings.DATABASES['default']['NAME']}_{os.getpid()}"


@pytest.fixture(autouse=True, scope="module")
def _stop_event_relay():
    """The web-process relay (dashboard.relay) started by socket tests holds sessions on the
    test database: stop it after each module (the next socket starts it again), so it neither
    outlives the database nor retries in modules that may not use the database."""
    yield
    from dashboard import relay

    relay.stop()


def pytest_configure(config):
    from tests import lanes

    lanes.register(config)
    _flush_by_delete()


def _flush_by_delete() -> None:
    """A transactional test ends with Django's flush: one TRUNCATE of every table, a quarter
    of a second on PostgreSQL (a new file for each table and index), then the post-migrate
    handlers re-making content types and permissions. The tables of a test hold a few rows:
    DELETE them, in one transaction whose foreign keys (deferrable, as Django makes them) are
    checked at the end, and keep the content types and permissions, which no test changes.
    Sequences are not reset, as with the TRUNCATE. A reset asked for still truncates."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    kept = {"django_content_type", "auth_permission"}

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        deletes = [f"DELETE FROM {self.quote_name(t)};" for t in tables if t not in kept]
        return ["SET CONSTRAINTS ALL DEFERRED;", *deletes]

    DatabaseOperations.sql_flush = sql_flush


def pytest_collection_modifyitems(config, items):
    from tests import lanes

    lanes.longest_first(items)


@pytest.fixture(autouse=True)
def _keels_celery_app_stays_current():
    """A test that makes a Celery app of its own must not leave it this thread's current app:
    every later ``current_app.send_task`` of the engine would go to that app's broker (a test
    that ran after it would find nothing on its queue, depending on the order of modules)."""
    from celery import current_app

    from keel.celery import app

    yield
    leaked = current_app._get_current_object()
    if leaked is not app:
        app.set_current()
        pytest.fail(f"the test left Celery app {leaked!r} current (use set_as_current=False)")


@pytest.fixture(autouse=True, scope="session")
def _test_file_roots():
    from django.conf import settings

    root = os.path.realpath(tempfile.gettempdir())
    if root not in settings.ENGINE["connectors.file-roots"]:
        settings.ENGINE["connectors.file-roots"].append(root)


from tests.clusterkit import (  # noqa: E402 (after the roots)
    Cluster,
    DatabaseTemplate,
    admin_conn,
    lane_redis_url,
)


def _use_the_lanes_redis() -> None:
    """This lane's own Redis database for the test process's channel layer and broker (and
    the processes it starts), so that lanes running side by side see none of each other's
    groups and queues. Settings are loaded before any conftest, so they are repointed here,
    before a test runs and before the layer or the Celery app first connects."""
    from django.conf import settings

    from keel.celery import app

    url = lane_redis_url("tests")
    os.environ["REDIS_URL"] = settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = url
    app.conf.broker_url = app.conf.result_backend = url
    for layer in settings.CHANNEL_LAYERS.values():
        for host in layer["CONFIG"]["hosts"]:
            host["address"] = url


_use_the_lanes_redis()


@pytest.fixture(scope="session")
def db_template():
    template = DatabaseTemplate()
    yield template
    template.drop_all()


@pytest.fixture(scope="session")
def django_db_setup(
    request, django_test_environment, django_db_blocker, django_db_modify_db_settings, db_template
):
    """The test database is a clone of the clusters' migrated template: one migrate per run,
    not two. pytest-django then finds it migrated (keepdb) and only checks it."""
    from django.conf import settings
    from django.test.utils import setup_databases
    from pytest_django.fixtures import _get_databases_for_setup

    name = settings.DATABASES["default"]["TEST"]["NAME"]
    with admin_conn(db_template.server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{db_template.name}"')
    aliases, serialized_aliases = _get_databases_for_setup(request.session.items)
    with django_db_blocker.unblock():
        setup_databases(
            verbosity=request.config.option.verbose,
            interactive=False,
            aliases=aliases,
            serialized_aliases=serialized_aliases,
            keepdb=True,
        )
    yield
    from django.db import connections

    connections.close_all()
    with admin_conn(db_template.server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def cluster(db_template):
    """A running cluster (1 master, 2 workers, 8 fixed slots, 3 s heartbeat timeout) shared by
    a module's tests; each destructive test restores it with ``cluster.restore()`` first. A
    module that hurts masters makes its own (tests/test_cluster.py)."""
    with Cluster(db_template, masters=1, workers=2, slots=8, heartbeat_timeout=3.0) as c:
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


@pytest.fixture
def api(db):
    """An API client signed in as an operator (may submit and cancel)."""
    from rest_framework.test import APIClient

    user = role_user("submitter", "operator")
    client = APIClient()
    client.force_authenticate(user)
    return client


def role_user(username: str, role: str, password: str = "x-Very-long-pass-0"):  # noqa: S107
    """A user in one of the role groups (engine.roles): viewer, operator or admin."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user = get_user_model().objects.create_user(username, password=password)
    user.groups.add(Group.objects.get(name=role))
    return user
