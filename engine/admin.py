from django.contrib import admin

from engine.models import EngineEvent, MasterCandidate, MasterLease, Member, Slot


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
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
    readonly_fields = [f.name for f in Member._meta.fields]


@admin.register(Slot)
class SlotAdmin(admin.ModelAdmin):
    list_display = ["member", "sequence", "state"]
    list_filter = ["state"]


@admin.register(EngineEvent)
class EngineEventAdmin(admin.ModelAdmin):
    list_display = ["seq", "at", "kind", "job_id", "member", "epoch"]
    list_filter = ["kind"]
    readonly_fields = [f.name for f in EngineEvent._meta.fields]


@admin.register(MasterLease)
class MasterLeaseAdmin(admin.ModelAdmin):
    list_display = ["epoch", "holder", "since", "expires_at"]
    readonly_fields = [f.name for f in MasterLease._meta.fields]


@admin.register(MasterCandidate)
class MasterCandidateAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "epoch", "pid", "last_seen", "fenced_rejections"]
