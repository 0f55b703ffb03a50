"""The master lease and the cluster counters are one row each, made by a migration; every
query of the cluster's state joins them. They exist again after a flush (as a test's ends),
and after a migrate backwards and forwards."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from engine.models import ClusterState, MasterLease
from engine.queries import overview

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_flush_leaves_the_singletons_and_the_overview_answers():
    call_command("flush", interactive=False, verbosity=0)
    assert MasterLease.objects.filter(id=1).exists()
    assert ClusterState.objects.filter(id=1).exists()
    assert overview()["members"] == {"alive": 0, "removed": 0, "left": 0}
