"""The event store."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .cluster import Member

#: Checkpoint progress: the most numerous events by far, left out of a job's story (the job
#: page lists its checkpoints in a section of their own); one index reads the rest.
CHECKPOINT_PROGRESS_KINDS = ("checkpoint.triggered", "checkpoint.completed")


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
            # A job's newest events but its checkpoint progress (the job page's list), read
            # in index order whatever the job's history; checkpoint events do not pay for it.
            models.Index(
                fields=["job_id", "-seq"],
                name="event_job_story",
                condition=~models.Q(kind__in=CHECKPOINT_PROGRESS_KINDS),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"
