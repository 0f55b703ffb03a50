from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _role_groups(sender, using="default", **kwargs) -> None:
    from engine.roles import ensure_groups

    ensure_groups()


def _singletons(sender, using="default", apps=None, **kwargs) -> None:
    """The master lease and the cluster counters (one row each, made by a migration) exist
    after every migrate or flush too: every query of the cluster's state joins them. With the
    models as the migration left them (a migrate backwards may leave fewer columns, or none)."""
    if apps is None:  # a flush sends none: the current models
        from django.apps import apps
    try:
        lease, counters = (apps.get_model("engine", n) for n in ("MasterLease", "ClusterState"))
    except LookupError:
        return  # the engine's tables are gone (migrated to zero)
    lease.objects.using(using).get_or_create(id=1)
    counters.objects.using(using).get_or_create(id=1)


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Engine"

    def ready(self) -> None:
        # After auth's own post_migrate handler made the permissions (a migrate, or a flush).
        post_migrate.connect(_role_groups, sender=self, dispatch_uid="keel-role-groups")
        post_migrate.connect(_singletons, sender=self, dispatch_uid="keel-singletons")
