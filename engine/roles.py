"""Roles: Django groups with the permissions each may use (created by a migration).

- viewer: the read API and the dashboard;
- operator: also submits, cancels and rescales jobs (a rescale takes the cancel permission:
  it stops the pipelines' attempts), drains members (a planned leave) and acknowledges a job's
  UNKNOWN recovery tracking;
- admin: also the admin site (with ``is_staff``) and named connections.
"""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

SUBMIT_JOB = "engine.submit_job"
CANCEL_JOB = "engine.cancel_job"
DRAIN_MEMBER = "engine.drain_member"
ACKNOWLEDGE_DIRTY = "engine.acknowledge_dirty"
VIEW_JOB = "engine.view_job"

#: Group -> permission codenames of the engine app ("view_*": every view permission).
GRANTS: dict[str, tuple[str, ...]] = {
    VIEWER: ("view_*",),
    OPERATOR: ("view_*", "submit_job", "cancel_job", "drain_member", "acknowledge_dirty"),
    ADMIN: (
        "view_*",
        "submit_job",
        "cancel_job",
        "drain_member",
        "acknowledge_dirty",
        "add_connection",
        "change_connection",
        "delete_connection",
    ),
}


def ensure_groups(group_model=None, permission_model=None) -> None:
    """Create the role groups with their permissions (idempotent). Run by a migration (with its
    historical models) and after every migrate or flush (engine.apps), so they always exist."""
    if group_model is None:
        from django.contrib.auth.models import Group as group_model
        from django.contrib.auth.models import Permission as permission_model
    engine_perms = permission_model.objects.filter(content_type__app_label="engine")
    for name, grants in GRANTS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        wanted: set[int] = set()
        for grant in grants:
            if grant.endswith("*"):
                found = engine_perms.filter(codename__startswith=grant[:-1])
            else:
                found = engine_perms.filter(codename=grant)
            wanted |= set(found.values_list("id", flat=True))
        group.permissions.set(wanted)
