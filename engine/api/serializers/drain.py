"""Serializers of planned leaves (member drains): the request and its record."""

from __future__ import annotations

from rest_framework import serializers

from engine.models import MemberDrain
from engine.states import DrainState


class DrainRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=500, help_text="Why the member is drained (audited with who asked)."
    )
    force = serializers.BooleanField(
        default=False,
        help_text="Drain even when the other members lack free slots for its task groups.",
    )


class DrainSerializer(serializers.ModelSerializer):
    requestId = serializers.UUIDField(source="request_id")
    memberUuid = serializers.UUIDField(source="member.uuid")
    memberName = serializers.CharField(source="member.name")
    state = serializers.ChoiceField(choices=DrainState.choices)
    requestedBy = serializers.CharField(source="requested_by_name")
    createdAt = serializers.DateTimeField(source="created_at")
    expiresAt = serializers.DateTimeField(source="expires_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    endReason = serializers.CharField(source="end_reason")
    movedTaskGroups = serializers.IntegerField(source="moved_task_groups")

    class Meta:
        model = MemberDrain
        fields = [
            "requestId",
            "memberUuid",
            "memberName",
            "state",
            "requestedBy",
            "reason",
            "createdAt",
            "expiresAt",
            "endedAt",
            "endReason",
            "movedTaskGroups",
        ]
