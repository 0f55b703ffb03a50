from django.urls import path

from . import views

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("jobs/<int:job_id>", views.job, name="job"),
    path("history/", views.finished_jobs, name="history"),
    path("cleanup/", views.cleanup_records, name="cleanup"),
]
