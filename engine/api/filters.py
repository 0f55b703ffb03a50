from __future__ import annotations

import django_filters

from engine.models import Member
from engine.states import MemberState


class MemberFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=MemberState.choices)

    class Meta:
        model = Member
        fields = ["state"]
