"""A job's checkpoints."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from engine.api.serializers.checkpoints import CheckpointSerializer
from engine.jobs import checkpoint_history
from engine.models import Checkpoint, Job


class JobCheckpointListView(generics.ListAPIView):
    """The job's recent checkpoints, newest first (at most 100), each with its size and its
    task groups' acks."""

    serializer_class = CheckpointSerializer
    pagination_class = None
    queryset = Checkpoint.objects.none()  # for the schema: list() answers checkpoint_history's

    def list(self, request: Request, *args, **kwargs) -> Response:
        job = get_object_or_404(Job.objects.only("id"), id=self.kwargs["job_id"])
        checkpoints = checkpoint_history.recent(job.id)
        return Response(self.get_serializer(checkpoints, many=True).data)
