"""Serializers of a job's checkpoints."""

from __future__ import annotations

from rest_framework import serializers

from engine.states import CheckpointState


class CheckpointSummarySerializer(serializers.Serializer):
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()
    latestId = serializers.IntegerField(allow_null=True)
    latestAt = serializers.DateTimeField(allow_null=True)


class CheckpointTaskSerializer(serializers.Serializer):
    """A task group's ack of a checkpoint."""

    taskGroupId = serializers.IntegerField()
    ackedAt = serializers.DateTimeField()
    sizeBytes = serializers.IntegerField(help_text="its snapshot's size as stored, in bytes")


class CheckpointSerializer(serializers.Serializer):
    """A checkpoint as engine.jobs.checkpoint_history.recent makes it (the one definition)."""

    checkpointId = serializers.IntegerField()
    pipelineId = serializers.IntegerField()
    state = serializers.ChoiceField(choices=CheckpointState.choices)
    triggeredAt = serializers.DateTimeField()
    endedAt = serializers.DateTimeField(allow_null=True)
    durationMs = serializers.IntegerField(allow_null=True)
    sizeBytes = serializers.IntegerField(help_text="the sum of its task groups' snapshot sizes")
    failureReason = serializers.CharField(allow_blank=True)
    tasks = CheckpointTaskSerializer(many=True, help_text="its acks, by task group id")
