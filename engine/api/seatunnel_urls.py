"""SeaTunnel's REST API v2 paths (engine.api.views.seatunnel), at the root as SeaTunnel
serves them; ``running-job/<id>`` is its deprecated name of ``job-info/<id>``."""

from __future__ import annotations

from django.urls import path

from engine.api.views import seatunnel as v

#: What changes jobs (the operator role), then what reads (the viewer role).
WRITES = (
    ("submit-job", v.SubmitJobView),
    ("submit-jobs", v.SubmitJobsView),
    ("stop-job", v.StopJobView),
    ("stop-jobs", v.StopJobsView),
)
READS = (
    ("job-info/<int:job_id>", v.JobInfoView),
    ("running-job/<int:job_id>", v.JobInfoView),
    ("running-jobs", v.RunningJobsView),
    ("finished-jobs", v.FinishedJobsView),
    ("finished-jobs/", v.FinishedJobsView),
    ("finished-jobs/<str:state>", v.FinishedJobsView),
    ("overview", v.OverviewView),
    ("system-monitoring-information", v.SystemMonitoringView),
)

urlpatterns = [path(route, view.as_view()) for route, view in WRITES + READS]
