from django.urls import path

from . import views

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:job_id>/", views.job, name="job"),
    path("jobs/<int:job_id>/cancel/", views.cancel, name="job-cancel"),
    path("members/<uuid:member_uuid>/drain/", views.drain, name="member-drain"),
    path("submit/", views.submit, name="submit"),
    path("history/", views.finished_jobs, name="history"),
    path("cleanup/", views.cleanup_records, name="cleanup"),
    # The paths from before the trailing slash (Django's convention) redirect to the above.
    path("jobs/<int:job_id>", views.moved("job")),
    path("jobs/<int:job_id>/cancel", views.moved("job-cancel")),
    path("members/<uuid:member_uuid>/drain", views.moved("member-drain")),
]
