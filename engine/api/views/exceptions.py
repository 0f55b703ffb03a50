"""A job's exception history."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine.api.serializers.exceptions import JobExceptionSerializer
from engine.jobs import exceptions
from engine.models import Job


class JobExceptionListView(APIView):
    """The job's task group failures, newest first (at most 16, as Flink keeps): errors with
    their tracebacks, and member losses, each saying whether the pipeline restored after."""

    @extend_schema(
        responses={200: JobExceptionSerializer(many=True)}, operation_id="jobs_exceptions"
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(Job.objects.only("id"), id=job_id)
        return Response(JobExceptionSerializer(exceptions.recent(job.id), many=True).data)
