"""Query filters of the list endpoints."""

from __future__ import annotations

import django_filters

from engine import dirty as dirty_tracking
from engine.models import Job, JobCleanupRecord, Member
from engine.states import CleanupKind, CleanupState, DirtyEvaluation, JobStatus, MemberState


class MemberFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=MemberState.choices)

    class Meta:
        model = Member
        fields = ["state"]


class JobFilter(django_filters.FilterSet):
    jobStatus = django_filters.ChoiceFilter(field_name="status", choices=JobStatus.choices)
    dirty = django_filters.BooleanFilter(method="filter_dirty", label="dirty")
    evaluationStatus = django_filters.ChoiceFilter(
        field_name="dirty_evaluation", choices=[(e, e) for e in DirtyEvaluation.values]
    )

    class Meta:
        model = Job
        fields = ["jobStatus", "dirty", "evaluationStatus"]

    def filter_dirty(self, queryset, name, value):
        return queryset if value is None else queryset.filter(dirty_tracking.dirty_filter(value))


class CleanupRecordFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=CleanupState.choices)
    kind = django_filters.ChoiceFilter(choices=CleanupKind.choices)
    jobId = django_filters.NumberFilter(field_name="job_id")

    class Meta:
        model = JobCleanupRecord
        fields = ["state", "kind", "jobId"]
