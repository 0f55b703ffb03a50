"""Cluster state: the master lease, cluster counters, master candidates, members and slots."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Value
from django.db.models.functions import Now

from engine.states import CandidateState, MemberState, SlotMode, SlotState


class MasterLease(models.Model):
    """Singleton (id=1): who the active master is, and the fencing epoch.

    ``epoch`` grows by one on every takeover and is the fencing token: every write made on behalf
    of the active master re-reads it under a key-share row lock inside its own transaction
    (``engine.fencing``). ``lock_backend_pid`` is the PostgreSQL backend that holds the leadership
    advisory lock, so a standby can end a frozen holder's session once the lease has expired.
    """

    id = models.SmallIntegerField(primary_key=True, default=1)
    epoch = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=200, blank=True, default="")
    lock_backend_pid = models.IntegerField(null=True, blank=True)
    since = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"epoch {self.epoch} held by {self.holder or 'nobody'}"


class ClusterState(models.Model):
    """Singleton (id=1): cluster-wide counters that must rise exactly once per event."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    #: Global member-event sequence: +1 in the transaction that marks a member REMOVED or LEFT.
    member_event_sequence = models.BigIntegerField(default=0)
    #: The member events every dirty-tracking job has handled, except those recorded in
    #: DirtyTrackingGap: the jobs' shared watermark (engine.dirty). Behind the sequence: UNKNOWN.
    dirty_handled_sequence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"member-event sequence {self.member_event_sequence}"


class MasterCandidate(models.Model):
    """One row per master process name: what it believes it is (for operators and tests).

    Writing this row is not a write on behalf of the active master, so it is not fenced; it is how
    a deposed master reports that its writes were rejected.
    """

    name = models.CharField(max_length=200, unique=True)
    pid = models.IntegerField()
    host = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=CandidateState.choices)
    epoch = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    fenced_rejections = models.IntegerField(default=0)
    last_rejected_epoch = models.BigIntegerField(null=True, blank=True)
    #: The protocol version this master runs (engine.protocol); 0 for rows written before it.
    protocol_version = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class MemberQuerySet(models.QuerySet):
    def alive(self) -> MemberQuerySet:
        """Members the cluster counts on: neither REMOVED nor LEFT."""
        return self.filter(state=MemberState.ALIVE)


class Member(models.Model):
    """An engine member: one worker process, from its start to its end.

    Every start is a new member with a fresh UUID; a restarted worker never resumes an old
    identity. ``lock_key`` is the member's session advisory lock key: the lock is held for the
    member's life by a dedicated connection, so the master sees a crash the moment PostgreSQL ends
    that session, well before the heartbeat timeout.
    """

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200, db_index=True)
    address = models.CharField(max_length=255)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    state = models.CharField(
        max_length=16, choices=MemberState.choices, default=MemberState.ALIVE, db_index=True
    )
    slot_mode = models.CharField(max_length=16, choices=SlotMode.choices)
    slot_count = models.IntegerField(help_text="fixed slots; for dynamic mode 0 means unbounded")
    protocol_version = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True, default="")
    #: ``{key: value}`` strings the worker was started with (``--tag``): a job's ``tag_filter``
    #: places it only on members whose tags hold every pair of the filter (SeaTunnel's member
    #: attributes). The database default lets rows be written without naming it.
    tags = models.JSONField(default=dict, db_default=Value({}, output_field=models.JSONField()))

    objects = MemberQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["state", "last_heartbeat"])]
        permissions = [("drain_member", "Can drain members (planned leave)")]

    def __str__(self) -> str:
        return f"{self.name} {self.uuid} ({self.state})"


class Slot(models.Model):
    """A member slot: fixed members own ``slot_count`` rows; dynamic ones get rows on demand."""

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="slots")
    sequence = models.IntegerField()
    state = models.CharField(max_length=16, choices=SlotState.choices, default=SlotState.FREE)

    class Meta:
        ordering = ["member_id", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["member", "sequence"], name="slot_member_sequence")
        ]

    def __str__(self) -> str:
        return f"slot {self.sequence} of {self.member_id}"
