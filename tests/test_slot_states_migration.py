"""Migration 0023 on real PostgreSQL: after it, a slot is ASSIGNED exactly when a live task
group names it (the earlier cleanup could free a slot under a live group, whose slot the
scheduler would then give to a second group, or leave one ASSIGNED with nobody on it)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection

from engine.models import Slot, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)

migration = importlib.import_module("engine.migrations.0023_slot_states_follow_task_groups")


def test_slot_states_follow_the_live_task_groups(engine):
    member = engine.add_member(slots=6)
    engine.submit()
    engine.schedule()
    held = set(TaskGroup.objects.exclude(slot=None).values_list("slot_id", flat=True))
    assert held
    lost_under_a_live_group = min(held)
    nobody_on_it = Slot.objects.filter(member=member).exclude(id__in=held).first().id
    Slot.objects.filter(id=lost_under_a_live_group).update(state="FREE")
    Slot.objects.filter(id=nobody_on_it).update(state="ASSIGNED")

    migration.mend(apps, SimpleNamespace(connection=connection))

    states = dict(Slot.objects.filter(member=member).values_list("id", "state"))
    assert {slot for slot, state in states.items() if state == "ASSIGNED"} == held
    migration.mend(apps, SimpleNamespace(connection=connection))
    assert dict(Slot.objects.filter(member=member).values_list("id", "state")) == states
