"""Planned leaves: an operator's drain of a member, the intent the active master acts on."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from engine.states import DrainState

from .cluster import Member


class MemberDrain(models.Model):
    """One drain request: who asked, why, until when, and how it ended.

    Written by the API in the requester's transaction (it is an intent, not a write on behalf of
    the master); the active master moves the member's task groups away, and once it has verified
    the member empty it ends the membership as LEFT, classified PLANNED_VERIFIED. At most one
    DRAINING request per member.
    """

    request_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="drains")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The requester's username, kept if the user is deleted (the audit must outlive it).
    requested_by_name = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    state = models.CharField(
        max_length=16, choices=DrainState.choices, default=DrainState.DRAINING, db_index=True
    )
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()
    #: Task groups the master moved off the member (failed there, restored elsewhere).
    moved_task_groups = models.IntegerField(default=0)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["member"],
                condition=Q(state=DrainState.DRAINING),
                name="one_drain_at_a_time",
            )
        ]

    def __str__(self) -> str:
        return f"drain of member {self.member_id} by {self.requested_by_name} ({self.state})"
