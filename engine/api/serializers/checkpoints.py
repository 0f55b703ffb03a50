"""Serializers of a job's checkpoints."""

from __future__ import annotations

from rest_framework import serializers

from engine.models import Checkpoint


class CheckpointSummarySerializer(serializers.Serializer):
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()
    latestId = serializers.IntegerField(allow_null=True)
    latestAt = serializers.DateTimeField(allow_null=True)


class CheckpointSerializer(serializers.ModelSerializer):
    checkpointId = serializers.IntegerField(source="id")
    pipelineId = serializers.IntegerField(source="pipeline.index")
    triggeredAt = serializers.DateTimeField(source="triggered_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    durationMs = serializers.SerializerMethodField()
    failureReason = serializers.CharField(source="failure_reason")

    class Meta:
        model = Checkpoint
        fields = [
            "checkpointId",
            "pipelineId",
            "state",
            "triggeredAt",
            "endedAt",
            "durationMs",
            "failureReason",
        ]

    def get_durationMs(self, checkpoint: Checkpoint) -> int | None:
        if checkpoint.ended_at is None:
            return None
        return int((checkpoint.ended_at - checkpoint.triggered_at).total_seconds() * 1000)
