"""A job's recovery episodes, and the acknowledgement of its UNKNOWN tracking (engine.dirty)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import dirty as dirty_tracking
from engine.api.serializers.dirty import (
    DirtyAckRequestSerializer,
    DirtyTaskSerializer,
    EpisodeSerializer,
)
from engine.models import Job
from engine.roles import ACKNOWLEDGE_DIRTY


class JobEpisodeListView(APIView):
    """The job's recent recovery episodes (at most engine.dirty-task.event-history-size),
    newest first; the same for running and finished jobs."""

    @extend_schema(responses={200: EpisodeSerializer(many=True)}, operation_id="jobs_episodes")
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(Job, id=job_id)
        return Response(dirty_tracking.job_episodes(job))


class JobDirtyAckView(APIView):
    """``POST {reason}``: an operator acknowledges the job's UNKNOWN recovery tracking after
    checking it (audited): they accept that its count cannot be verified, and it keeps reading
    UNKNOWN, acknowledged. Answers its new ``dirtyTask`` summary."""

    role_permissions = {"POST": ACKNOWLEDGE_DIRTY}

    @extend_schema(
        request=DirtyAckRequestSerializer,
        responses={200: DirtyTaskSerializer},
        operation_id="jobs_dirty_ack",
    )
    def post(self, request: Request, job_id: int) -> Response:
        body = DirtyAckRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            summary = dirty_tracking.acknowledge(
                job_id, request.user, body.validated_data["reason"]
            )
        except dirty_tracking.AcknowledgementRefused as exc:
            return Response({"detail": str(exc)}, status=exc.status)
        return Response(summary, status=status.HTTP_200_OK)
