"""Job endpoints: submit, list, detail, cancel, rescale. Views validate and call engine.jobs."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import dirty as dirty_tracking
from engine.api.filters import JobFilter
from engine.api.pagination import JobPagination
from engine.api.serializers.jobs import (
    JobCreatedSerializer,
    JobDetailSerializer,
    JobSubmitSerializer,
    JobSummarySerializer,
)
from engine.jobconfig import ConfigError
from engine.jobs import summary as job_summary
from engine.jobs.cancel import JobStateError, cancel_job
from engine.jobs.envoptions import MAX_PARALLELISM
from engine.jobs.rescale import RescaleRefused, request_rescale
from engine.jobs.submission import WorkersUnavailable, submit_job
from engine.models import Job
from engine.roles import CANCEL_JOB, SUBMIT_JOB


class JobListView(generics.ListAPIView):
    """Jobs, newest first; ``?jobStatus=``, ``?dirty=``, ``?evaluationStatus=`` and ``?q=``
    (name or id) filter, as on the dashboard's jobs page. POST submits a job."""

    serializer_class = JobSummarySerializer
    filterset_class = JobFilter
    pagination_class = JobPagination
    role_permissions = {"POST": SUBMIT_JOB}

    def get_queryset(self):
        return dirty_tracking.annotate(Job.objects.order_by("-id"))

    @extend_schema(
        request=JobSubmitSerializer,
        responses={201: JobCreatedSerializer},
        operation_id="jobs_submit",
    )
    def post(self, request: Request) -> Response:
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = submit_job(
                body.validated_data["config"],
                body.validated_data.get("jobName"),
                body.validated_data.get("variables"),
                submitted_by=request.user,
            )
        except ConfigError as exc:
            raise ValidationError({"errors": exc.errors}) from None
        except WorkersUnavailable as exc:
            return Response(
                {"detail": str(exc)},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
                headers={"Retry-After": "5"},
            )
        return Response(
            {
                "jobId": job.id,
                "jobName": job.name,
                "jobStatus": job.status,
                "warnings": job.warnings,
            },
            status=status.HTTP_201_CREATED,
        )


class JobDetailView(generics.RetrieveAPIView):
    serializer_class = JobDetailSerializer
    lookup_url_kwarg = "job_id"

    def get_queryset(self):
        return job_summary.with_groups(Job.objects.select_related("history"))


class JobCancelView(APIView):
    role_permissions = {"POST": CANCEL_JOB}

    @extend_schema(request=None, responses={202: JobCreatedSerializer}, operation_id="jobs_cancel")
    def post(self, request: Request, job_id: int) -> Response:
        get_object_or_404(Job, id=job_id)
        try:
            job = cancel_job(job_id, by=request.user)
        except JobStateError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(
            {"jobId": job.id, "jobName": job.name, "jobStatus": job.status},
            status=status.HTTP_202_ACCEPTED,
        )


class JobRescaleSerializer(serializers.Serializer):
    parallelism = serializers.IntegerField(
        min_value=1,
        max_value=MAX_PARALLELISM,
        help_text="the readers each pipeline runs with once rescaled",
    )


class JobRescaleView(APIView):
    """Rescale a RUNNING job's Lane A pipelines: each restores from its latest completed
    checkpoint with ``parallelism`` readers, its splits dealt to them by split id
    (docs/source-runtime.md). The answer comes once the request is recorded; job detail shows
    the pipelines' new readers once the master has run it."""

    role_permissions = {"POST": CANCEL_JOB}

    @extend_schema(
        request=JobRescaleSerializer,
        responses={
            202: inline_serializer(
                "JobRescaleAccepted",
                {
                    "jobId": serializers.IntegerField(),
                    "jobName": serializers.CharField(),
                    "jobStatus": serializers.CharField(),
                    "parallelism": serializers.IntegerField(),
                },
            ),
            400: OpenApiResponse(
                inline_serializer(
                    "JobRescaleInvalid",
                    {
                        "errors": inline_serializer(
                            "JobRescaleFieldError",
                            {"path": serializers.CharField(), "message": serializers.CharField()},
                            many=True,
                        )
                    },
                ),
                description="a bad parallelism, by field",
            ),
            409: OpenApiResponse(
                inline_serializer("JobRescaleConflict", {"detail": serializers.CharField()}),
                description="the job is not RUNNING; a pipeline runs in Lane B, is restoring, "
                "has no completed checkpoint, runs at that parallelism already, or has a "
                "checkpoint that cannot be dealt to it; or the cluster has no room for it",
            ),
        },
        operation_id="jobs_rescale",
    )
    def post(self, request: Request, job_id: int) -> Response:
        get_object_or_404(Job, id=job_id)
        body = JobRescaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wanted = body.validated_data["parallelism"]
        try:
            job = request_rescale(job_id, wanted, by=request.user)
        except RescaleRefused as exc:
            if exc.field:  # as a body's validation errors read
                errors = [{"path": exc.field, "message": str(exc).removeprefix(f"{exc.field}: ")}]
                return Response({"errors": errors}, status=exc.status)
            return Response({"detail": str(exc)}, status=exc.status)
        return Response(
            {"jobId": job.id, "jobName": job.name, "jobStatus": job.status, "parallelism": wanted},
            status=status.HTTP_202_ACCEPTED,
        )
