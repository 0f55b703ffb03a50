from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from engine.api.views import (
    checkpoints,
    cleanup,
    cluster,
    docs,
    episodes,
    events,
    exceptions,
    jobs,
    logs,
)

urlpatterns = [
    path("overview", cluster.OverviewView.as_view(), name="api-overview"),
    path("members", cluster.MemberListView.as_view(), name="api-members"),
    path(
        "members/<uuid:member_uuid>/drain",
        cluster.MemberDrainView.as_view(),
        name="api-member-drain",
    ),
    path("slots", cluster.SlotListView.as_view(), name="api-slots"),
    path("events", events.EventListView.as_view(), name="api-events"),
    path("jobs", jobs.JobListView.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>", jobs.JobDetailView.as_view(), name="api-job"),
    path(
        "jobs/<int:job_id>/checkpoints",
        checkpoints.JobCheckpointListView.as_view(),
        name="api-job-checkpoints",
    ),
    path(
        "jobs/<int:job_id>/exceptions",
        exceptions.JobExceptionListView.as_view(),
        name="api-job-exceptions",
    ),
    path("jobs/<int:job_id>/logs", logs.JobLogListView.as_view(), name="api-job-logs"),
    path(
        "jobs/<int:job_id>/episodes", episodes.JobEpisodeListView.as_view(), name="api-job-episodes"
    ),
    path("jobs/<int:job_id>/cancel", jobs.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/rescale", jobs.JobRescaleView.as_view(), name="api-job-rescale"),
    path(
        "jobs/<int:job_id>/dirty/ack",
        episodes.JobDirtyAckView.as_view(),
        name="api-job-dirty-ack",
    ),
    path("cleanup-records", cleanup.CleanupRecordListView.as_view(), name="api-cleanup-records"),
    path("schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs", docs.ApiDocsView.as_view(), name="api-docs"),
]
