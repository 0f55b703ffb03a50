from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard import views as dashboard_views
from engine.api.views import metrics as metrics_views

urlpatterns = [
    path("healthz", dashboard_views.healthz, name="healthz"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("api/v1/", include("engine.api.urls")),
    path("", include("engine.api.seatunnel_urls")),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("dashboard.urls")),
]
