from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _role_groups(sender, using="default", **kwargs) -> None:
    from engine.roles import ensure_groups

    ensure_groups()


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Engine"

    def ready(self) -> None:
        # After auth's own post_migrate handler made the permissions (a migrate, or a flush).
        post_migrate.connect(_role_groups, sender=self, dispatch_uid="keel-role-groups")
