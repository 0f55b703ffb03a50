"""The admin site (staff only). Engine state (leases, candidates, members, slots, events, jobs
and their task groups) is read-only: the engine writes it under its fences, and a row added or
edited by hand would contradict them. Admins change what is theirs: named connections, and the
users and groups of the roles."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from engine.models import (
    Connection,
    EngineEvent,
    Job,
    MasterCandidate,
    MasterLease,
    Member,
    Slot,
    TaskGroup,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, searchable, never added, changed or deleted by hand."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Member)
class MemberAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "uuid",
        "state",
        "slot_mode",
        "slot_count",
        "started_at",
        "last_heartbeat",
    ]
    list_filter = ["state", "slot_mode"]
    search_fields = ["name", "uuid", "address"]


@admin.register(Slot)
class SlotAdmin(ReadOnlyAdmin):
    list_display = ["member", "sequence", "state"]
    list_filter = ["state"]


@admin.register(EngineEvent)
class EngineEventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "at", "kind", "job_id", "member", "epoch"]
    list_filter = ["kind"]


@admin.register(MasterLease)
class MasterLeaseAdmin(ReadOnlyAdmin):
    list_display = ["epoch", "holder", "since", "expires_at"]


@admin.register(MasterCandidate)
class MasterCandidateAdmin(ReadOnlyAdmin):
    list_display = ["name", "state", "epoch", "pid", "last_seen", "fenced_rejections"]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs with who submitted and cancelled them (the audit); config secrets are redacted."""

    list_display = ["id", "name", "status", "submitted_by", "canceled_by", "created_at"]
    list_filter = ["status"]
    search_fields = ["name"]
    exclude = ["env"]  # the resolved options (a named connection's name, never its password)


@admin.register(TaskGroup)
class TaskGroupAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "kind", "index", "status", "attempt", "member"]
    list_filter = ["status", "kind"]


class ConnectionForm(forms.ModelForm):
    password = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        help_text="stored encrypted and never shown; leave blank to keep the current one",
    )

    class Meta:
        model = Connection
        fields = ["name", "url", "user", "password", "description"]

    def clean(self):
        from engine.connectors.boundaries import Refused, check_database

        data = super().clean()
        if data.get("url"):
            try:
                check_database(data["url"], named=True)
            except Refused as exc:
                self.add_error("url", str(exc))
        if not self.instance.password_encrypted and not data.get("password"):
            self.add_error("password", "a new connection needs a password")
        return data

    def save(self, commit=True):
        connection = super().save(commit=False)
        if self.cleaned_data.get("password"):
            connection.set_password(self.cleaned_data["password"])
        if commit:
            connection.save()
        return connection


@admin.register(Connection)
class ConnectionAdmin(admin.ModelAdmin):
    form = ConnectionForm
    list_display = ["name", "url", "user", "description", "updated_at"]
    search_fields = ["name", "url"]
