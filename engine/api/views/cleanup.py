"""Cleanup records: the durable intents that remove what finished jobs leave behind."""

from __future__ import annotations

from rest_framework import generics

from engine.api.filters import CleanupRecordFilter
from engine.api.pagination import JobPagination
from engine.api.serializers.cleanup import CleanupRecordSerializer
from engine.models import JobCleanupRecord


class CleanupRecordListView(generics.ListAPIView):
    """Cleanup records, soonest due last (``?state=``, ``?kind=``, ``?jobId=``), paginated."""

    serializer_class = CleanupRecordSerializer
    filterset_class = CleanupRecordFilter
    pagination_class = JobPagination
    queryset = JobCleanupRecord.objects.order_by("-due_at", "-id")
