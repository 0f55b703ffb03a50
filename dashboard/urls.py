from django.urls import path

from . import views

urlpatterns = [
    path("", views.cluster, name="cluster"),
]
