"""Serializers of the event store's pages."""

from __future__ import annotations

from rest_framework import serializers

from engine.models import EngineEvent


class EngineEventSerializer(serializers.ModelSerializer):
    jobId = serializers.IntegerField(source="job_id", allow_null=True)
    memberUuid = serializers.UUIDField(source="member.uuid", allow_null=True, default=None)

    class Meta:
        model = EngineEvent
        fields = ["seq", "at", "kind", "jobId", "memberUuid", "epoch", "payload"]


class EventPageSerializer(serializers.Serializer):
    results = EngineEventSerializer(many=True)
    nextAfter = serializers.IntegerField()


class EventQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=0, default=0, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=500, default=500, required=False)
