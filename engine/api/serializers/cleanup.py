"""Cleanup records (engine.jobs.cleanup) as the API shows them."""

from __future__ import annotations

from rest_framework import serializers

from engine.states import CleanupKind, CleanupState


class CleanupRecordSerializer(serializers.Serializer):
    """One record: which job, what it removes, when it is due and how its execution went."""

    jobId = serializers.IntegerField(source="job_id")
    jobName = serializers.CharField(source="job_name")
    kind = serializers.ChoiceField(choices=CleanupKind.choices)
    state = serializers.ChoiceField(choices=CleanupState.choices)
    dueAt = serializers.DateTimeField(source="due_at")
    createdAt = serializers.DateTimeField(source="created_at")
    executedAt = serializers.DateTimeField(source="executed_at", allow_null=True)
    attempts = serializers.IntegerField(help_text="executions tried, failed ones included")
    lastError = serializers.CharField(source="last_error", allow_blank=True)
