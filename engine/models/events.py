"""The event store."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .cluster import Member


class EngineEvent(models.Model):
    """The event store: appended in the same transaction as every cluster state change.

    ``seq`` values become visible in order (see engine.events): a reader that pages with
    ``after=seq`` never skips an event that commits late.
    """

    seq = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    kind = models.CharField(max_length=64)  # indexed in Meta: a btree, no LIKE index
    job_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    #: The master epoch the event was written under (None for events written by a member).
    epoch = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["seq"]
        indexes = [
            models.Index(fields=["at"]),  # retention by age
            # Only the btree (a db_index field also gets a LIKE index no query uses): one
            # index fewer to write for every event appended.
            models.Index(fields=["kind"], name="engine_event_kind"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"
