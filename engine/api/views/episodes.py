"""A job's recovery episodes (engine.dirty)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import dirty as dirty_tracking
from engine.api.serializers.dirty import EpisodeSerializer
from engine.models import Job


class JobEpisodeListView(APIView):
    """The job's recent recovery episodes (at most engine.dirty-task.event-history-size),
    newest first; the same for running and finished jobs."""

    @extend_schema(responses={200: EpisodeSerializer(many=True)}, operation_id="jobs_episodes")
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(Job, id=job_id)
        return Response(dirty_tracking.job_episodes(job))
