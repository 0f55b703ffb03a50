"""A job's task log lines, as its workers shipped them (engine.member.tasklog_shipping)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine.api.serializers.logs import (
    TaskLogLineSerializer,
    TaskLogPageSerializer,
    TaskLogQuerySerializer,
)
from engine.jobs import tasklog_reading
from engine.models import Job


class JobLogListView(APIView):
    """The job's newest log lines (at most ``limit``, 500 by default), oldest first; with
    ``?after=lineId`` the lines after that one, for a client that polls. ``taskGroup`` keeps
    one task group's lines, ``level`` those at or above a level."""

    @extend_schema(
        parameters=[TaskLogQuerySerializer],
        responses=TaskLogPageSerializer,
        operation_id="jobs_logs",
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(Job, id=job_id)
        query = TaskLogQuerySerializer(data=request.query_params, context={"job_id": job.id})
        query.is_valid(raise_exception=True)
        given = query.validated_data
        lines = tasklog_reading.recent(
            job.id,
            task_group_id=given.get("taskGroup"),
            min_level=given.get("level"),
            limit=given["limit"],
            after=given.get("after"),
        )
        return Response(
            {
                "results": TaskLogLineSerializer(lines, many=True).data,
                "nextAfter": lines[-1]["lineId"] if lines else given.get("after"),
            }
        )
