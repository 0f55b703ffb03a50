"""Role permissions on the API (engine.roles): reads need the viewer role's view permission,
submitting and cancelling the operator's. A view names what its unsafe methods need; a method it
does not name is refused."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from engine.roles import OPERATOR, VIEW_JOB, VIEWER


class HasRole(BasePermission):
    message = "permission denied"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in SAFE_METHODS:
            needed = VIEW_JOB
        else:
            needed = getattr(view, "role_permissions", {}).get(request.method)
            if needed is None:
                self.message = f"{request.method} is not allowed here for any role"
                return False
        if user.has_perm(needed):
            return True
        role = VIEWER if needed == VIEW_JOB else OPERATOR
        self.message = (
            f"permission denied: this needs {needed} (the {role} role); "
            f"ask an admin to add {user.get_username()!r} to the {role} group"
        )
        return False
