"""The admin site (staff only). Engine state (leases, candidates, members, slots, events, jobs
and their task groups) is read-only: the engine writes it under its fences, and a row added or
edited by hand would contradict them. Admins change what is theirs: named connections, and the
users and groups of the roles."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils.html import format_html

from engine.jobs import cleanup
from engine.models import (
    Connection,
    EngineEvent,
    Job,
    JobCleanupRecord,
    MasterCandidate,
    MasterLease,
    Member,
    MemberDrain,
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


@admin.register(MemberDrain)
class MemberDrainAdmin(ReadOnlyAdmin):
    """The drain audit: who drained which member, why, and how it ended (drains are asked
    through the API or the dashboard, never made here)."""

    list_display = ["member", "state", "requested_by_name", "reason", "created_at", "ended_at"]
    list_filter = ["state"]
    search_fields = ["member__name", "requested_by_name", "reason", "request_id"]
    date_hierarchy = "created_at"


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
        from engine.connectors.mysql.urls import is_mysql_url, parse_url

        data = super().clean()
        if data.get("url"):
            try:
                if is_mysql_url(data["url"]):
                    parse_url(data["url"])
                else:
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


@admin.register(JobCleanupRecord)
class JobCleanupRecordAdmin(admin.ModelAdmin):
    """The cleanup console: records are the engine's, so nothing about one is edited by hand;
    "run now" and "retry failed" go through the same durable path as the sweep (the record is
    made due, and is put on the control queue), and each is recorded in the admin log."""

    list_display = [
        "job_id",
        "job_name",
        "kind",
        "state",
        "due_at",
        "attempts",
        "executed_at",
        "short_error",
    ]
    list_filter = ["state", "kind", ("due_at", admin.DateFieldListFilter)]
    date_hierarchy = "due_at"
    search_fields = ["job_name", "=job_id"]
    actions = ["run_now", "retry_failed"]
    readonly_fields = [
        "job_id",
        "job_name",
        "kind",
        "state",
        "due_at",
        "created_at",
        "enqueued_at",
        "executed_at",
        "attempts",
        "executions",
        "last_error",
        "history",
    ]
    change_list_template = "admin/engine/jobcleanuprecord/change_list.html"

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # viewing (and the actions) only

    def get_search_results(self, request, queryset, search_term):
        if search_term.strip().isdigit():
            return queryset.filter(job_id=int(search_term.strip())), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="last error")
    def short_error(self, record: JobCleanupRecord) -> str:
        return (record.last_error[:80] + "…") if len(record.last_error) > 80 else record.last_error

    @admin.display(description="history")
    def history(self, record: JobCleanupRecord) -> str:
        from history.models import JobHistory

        found = JobHistory.objects.filter(job_id=record.job_id).first()
        if found is None:
            return "none (removed, or never written)"
        summary = found.summary or {}
        metrics = summary.get("metrics", {})
        return format_html(
            "{} at {}; {} rows read, {} written; dirty: {}; {}",
            found.status,
            found.finished_at,
            metrics.get("sourceReceivedCount", "?"),
            metrics.get("sinkWriteCount", "?"),
            (found.dirty_task or {}).get("evaluationStatus", "DISABLED"),
            found.error_msg or "no error",
        )

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "overdue": cleanup.overdue_count()}
        return super().changelist_view(request, extra_context)

    def _act(self, request, queryset, change, verb: str) -> None:
        done = []
        for record in queryset:
            if change(record.id):
                done.append(record.id)
                self.log_change(request, record, f"{verb} (by hand)")
        if done:
            cleanup.enqueue(done)
        self.message_user(request, f"{verb}: {len(done)} of {queryset.count()} records")

    @admin.action(description="Run now (open records)", permissions=["view"])
    def run_now(self, request, queryset):
        self._act(request, queryset, cleanup.run_now, "run now")

    @admin.action(description="Retry failed records", permissions=["view"])
    def retry_failed(self, request, queryset):
        self._act(request, queryset, cleanup.retry_failed, "retry failed")
