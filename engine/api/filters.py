"""Query filters of the list endpoints, and of the dashboard's pages (dashboard.filters): one
definition each, so a filter value means the same on a page and in the API."""

from __future__ import annotations

import django_filters
from django.db.models import Q

from engine import dirty as dirty_tracking
from engine.models import Job, JobCleanupRecord, Member
from engine.states import (
    JOB_TERMINAL,
    CleanupKind,
    CleanupState,
    DirtyEvaluation,
    JobStatus,
    MemberState,
)
from history.models import JobHistory

#: The longest ``?q=`` a job search takes (the dashboard cuts what is typed to it).
MAX_SEARCH = 100
#: The most digits ``?q=`` may have to match a job id as well (a bigint has 19).
_ID_DIGITS = 18


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
    q = django_filters.CharFilter(
        method="filter_q", max_length=MAX_SEARCH, label="a part of the job's name, or its id"
    )

    class Meta:
        model = Job
        fields = ["jobStatus", "dirty", "evaluationStatus", "q"]

    def filter_dirty(self, queryset, name, value):
        return queryset if value is None else queryset.filter(dirty_tracking.dirty_filter(value))

    def filter_q(self, queryset, name, value):
        """Jobs whose name holds ``value`` (any case), or whose id it is."""
        match = Q(name__icontains=value)
        if value.isascii() and value.isdigit() and len(value) <= _ID_DIGITS:
            match |= Q(id=int(value))
        return queryset.filter(match)


class JobHistoryFilter(django_filters.FilterSet):
    """Finished jobs' history records: ``jobStatus`` as for jobs, one of the terminal ones."""

    jobStatus = django_filters.ChoiceFilter(
        field_name="status", choices=[(s.value, s.label) for s in JobStatus if s in JOB_TERMINAL]
    )

    class Meta:
        model = JobHistory
        fields = ["jobStatus"]


class CleanupRecordFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=CleanupState.choices)
    kind = django_filters.ChoiceFilter(choices=CleanupKind.choices)
    jobId = django_filters.NumberFilter(field_name="job_id")

    class Meta:
        model = JobCleanupRecord
        fields = ["state", "kind", "jobId"]
