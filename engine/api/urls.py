from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from . import views

urlpatterns = [
    path("overview", views.OverviewView.as_view(), name="api-overview"),
    path("members", views.MemberListView.as_view(), name="api-members"),
    path("events", views.EventListView.as_view(), name="api-events"),
    path("schema", SpectacularAPIView.as_view(), name="api-schema"),
]
