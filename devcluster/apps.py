from django.apps import AppConfig


class DevclusterConfig(AppConfig):
    name = "devcluster"
    verbose_name = "Local cluster"
