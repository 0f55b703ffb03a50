from django.db import migrations


def create_singletons(apps, schema_editor):
    apps.get_model("engine", "MasterLease").objects.get_or_create(id=1)
    apps.get_model("engine", "ClusterState").objects.get_or_create(id=1)


class Migration(migrations.Migration):
    dependencies = [("engine", "0001_initial")]
    operations = [migrations.RunPython(create_singletons, migrations.RunPython.noop)]
