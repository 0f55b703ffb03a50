"""The role groups (engine.roles): viewer, operator, admin, with their permissions."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from engine.roles import ensure_groups


def create_groups(apps, schema_editor):
    # Permissions are normally created after every migration ran: make them now.
    for config in apps.get_app_configs():
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    ensure_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0011_connections_roles_audit"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
