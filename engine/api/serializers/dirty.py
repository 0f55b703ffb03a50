"""Serializers of the dirty-job label and recovery episodes (engine.dirty)."""

from __future__ import annotations

from rest_framework import serializers

from engine.states import AttemptState, DirtyEvaluation, EpisodeStatus


class DirtyTaskListSerializer(serializers.Serializer):
    """The dirty-job label in job lists; a disabled job has only the first two fields."""

    dirty = serializers.BooleanField()
    evaluationStatus = serializers.ChoiceField(choices=DirtyEvaluation.values)
    recoveryAttemptCount = serializers.IntegerField(required=False)


class EpisodeIncidentSerializer(serializers.Serializer):
    lostMemberUuid = serializers.UUIDField()
    lostAddress = serializers.CharField()
    classification = serializers.CharField()
    at = serializers.DateTimeField()


class EpisodeAttemptSerializer(serializers.Serializer):
    attemptId = serializers.CharField(help_text="<episodeId>-<pipelineId>-<prepareSequence>")
    pipelineId = serializers.IntegerField()
    prepareSequence = serializers.IntegerField()
    state = serializers.ChoiceField(choices=AttemptState.values)
    at = serializers.DateTimeField()


class EpisodeSerializer(serializers.Serializer):
    episodeId = serializers.IntegerField()
    status = serializers.ChoiceField(choices=EpisodeStatus.values)
    startedAt = serializers.DateTimeField()
    endedAt = serializers.DateTimeField(allow_null=True)
    generation = serializers.IntegerField()
    classification = serializers.CharField()
    endReason = serializers.CharField(allow_null=True)
    incidents = EpisodeIncidentSerializer(many=True)
    attempts = EpisodeAttemptSerializer(many=True)


class DirtyTaskSerializer(DirtyTaskListSerializer):
    """The dirty-job (recovery-degraded) summary of a running or finished job (engine.dirty);
    a disabled job has only ``dirty`` and ``evaluationStatus``."""

    trackingComplete = serializers.BooleanField(required=False)
    threshold = serializers.IntegerField(required=False)
    recoveryEpisodeCount = serializers.IntegerField(required=False)
    memberLossIncidentCount = serializers.IntegerField(required=False)
    activeEpisodeId = serializers.IntegerField(required=False, allow_null=True)
    lastLeaveClassification = serializers.CharField(required=False, allow_null=True)
    lastLostMemberUuid = serializers.UUIDField(required=False, allow_null=True)
    lastLostAddress = serializers.CharField(required=False, allow_null=True)
    lastCountedTime = serializers.IntegerField(
        required=False, allow_null=True, help_text="epoch milliseconds"
    )
    firstDirtyTime = serializers.IntegerField(
        required=False, allow_null=True, help_text="epoch milliseconds"
    )
    incompleteReason = serializers.CharField(
        required=False, allow_null=True, help_text="why the evaluation is UNKNOWN"
    )
    recentEpisodes = EpisodeSerializer(
        many=True,
        required=False,
        help_text="newest first, at most engine.dirty-task.event-history-size (job detail only)",
    )
    acknowledgedBy = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="who last acknowledged the UNKNOWN evaluation: they accepted that the count "
        "cannot be verified (it stays UNKNOWN)",
    )
    acknowledgedAt = serializers.DateTimeField(required=False, allow_null=True)
    acknowledgedReason = serializers.CharField(
        required=False, allow_null=True, help_text="what they checked"
    )


class DirtyAckRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, help_text="What was checked (audited).")
