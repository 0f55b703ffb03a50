"""A job's checkpoints."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from rest_framework import generics

from engine.api.serializers.checkpoints import CheckpointSerializer
from engine.models import Checkpoint, Job


class JobCheckpointListView(generics.ListAPIView):
    """The job's recent checkpoints, newest first (at most 100)."""

    serializer_class = CheckpointSerializer
    pagination_class = None

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Checkpoint.objects.none()
        job = get_object_or_404(Job, id=self.kwargs["job_id"])
        return Checkpoint.objects.filter(job=job).select_related("pipeline").order_by("-id")[:100]
