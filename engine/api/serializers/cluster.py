"""Serializers of the cluster resources: overview, members, slots (camelCase is the contract)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from engine.models import Member
from engine.states import MemberState


class SlotCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    assigned = serializers.IntegerField()
    free = serializers.IntegerField()


class MemberSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=MemberState.choices)
    slots = serializers.SerializerMethodField()
    startedAt = serializers.DateTimeField(source="started_at")
    lastHeartbeat = serializers.DateTimeField(source="last_heartbeat")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    endReason = serializers.CharField(source="end_reason")
    slotMode = serializers.CharField(source="slot_mode")
    protocolVersion = serializers.IntegerField(source="protocol_version")

    class Meta:
        model = Member
        fields = [
            "uuid",
            "name",
            "address",
            "state",
            "slots",
            "slotMode",
            "startedAt",
            "lastHeartbeat",
            "endedAt",
            "endReason",
            "protocolVersion",
            "pid",
        ]

    @extend_schema_field(SlotCountsSerializer)
    def get_slots(self, member: Member) -> dict:
        total = member.slot_total
        assigned = member.slot_assigned
        return {"total": total, "assigned": assigned, "free": total - assigned}


class ActiveMasterSerializer(serializers.Serializer):
    name = serializers.CharField()
    epoch = serializers.IntegerField()
    since = serializers.DateTimeField()
    leaseExpiresAt = serializers.DateTimeField()


class MemberCountsSerializer(serializers.Serializer):
    alive = serializers.IntegerField()
    removed = serializers.IntegerField()
    left = serializers.IntegerField()


class OverviewSerializer(serializers.Serializer):
    activeMaster = ActiveMasterSerializer(allow_null=True)
    epoch = serializers.IntegerField()
    members = MemberCountsSerializer()
    totalSlot = serializers.IntegerField()
    assignedSlot = serializers.IntegerField()
    unassignedSlot = serializers.IntegerField()
    memberEventSequence = serializers.IntegerField()
    runningJobs = serializers.IntegerField()
    pendingJobs = serializers.IntegerField()
    finishedJobs = serializers.IntegerField()
    failedJobs = serializers.IntegerField()
    canceledJobs = serializers.IntegerField()


class SlotOwnerSerializer(serializers.Serializer):
    jobId = serializers.IntegerField()
    pipelineId = serializers.IntegerField()
    taskGroupId = serializers.IntegerField()


class MemberRefSerializer(serializers.Serializer):
    """A member named in another resource (a slot, a task group)."""

    uuid = serializers.UUIDField()
    name = serializers.CharField()


class SlotSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sequence = serializers.IntegerField()
    state = serializers.CharField()
    member = MemberRefSerializer()
    owner = SlotOwnerSerializer(allow_null=True)
