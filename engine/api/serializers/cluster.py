"""Serializers of the cluster resources: overview, members, slots (camelCase is the contract)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from engine.api.serializers.drain import DrainSerializer
from engine.api.serializers.records import integers, record
from engine.models import Member
from engine.states import MemberState

SlotCountsSerializer = record(
    __name__, "SlotCountsSerializer", "A member's slots.", integers("total", "assigned", "free")
)


class MemberSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=MemberState.choices)
    slots = serializers.SerializerMethodField()
    startedAt = serializers.DateTimeField(source="started_at")
    lastHeartbeat = serializers.DateTimeField(source="last_heartbeat")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    endReason = serializers.CharField(source="end_reason")
    slotMode = serializers.CharField(source="slot_mode")
    protocolVersion = serializers.IntegerField(source="protocol_version")
    tags = serializers.DictField(
        child=serializers.CharField(),
        help_text="The worker's tags ({key: value}, from `--tag`), which a job's "
        "env.tag_filter matches.",
    )
    drain = serializers.SerializerMethodField(help_text="The member's latest drain, if any.")

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
            "tags",
            "drain",
        ]

    @extend_schema_field(DrainSerializer(allow_null=True))
    def get_drain(self, member: Member) -> dict | None:
        drains = member.drains.all()  # prefetched newest first (engine.queries.members)
        return DrainSerializer(drains[0]).data if drains else None

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


MemberCountsSerializer = record(
    __name__, "MemberCountsSerializer", "Members by state.", integers("alive", "removed", "left")
)

OverviewSerializer = record(
    __name__,
    "OverviewSerializer",
    "The cluster at a glance.",
    {
        "activeMaster": ActiveMasterSerializer(allow_null=True),
        "epoch": serializers.IntegerField(),
        "members": MemberCountsSerializer(),
        **integers(
            "totalSlot",
            "assignedSlot",
            "unassignedSlot",
            "memberEventSequence",
            "runningJobs",
            "pendingJobs",
            "finishedJobs",
            "failedJobs",
            "canceledJobs",
        ),
    },
)

SlotOwnerSerializer = record(
    __name__,
    "SlotOwnerSerializer",
    "The task group that holds a slot.",
    integers("jobId", "pipelineId", "taskGroupId"),
)


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
