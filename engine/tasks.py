"""Celery tasks. Handlers only validate and hand work to the member runtime; they own no state."""

from __future__ import annotations

from celery import shared_task

from .worker import current_member


@shared_task(name="engine.member.ping", acks_late=False)
def member_ping(expected_name: str | None = None) -> dict:
    """Answer with the identity of the member that consumed the command (a liveness probe)."""
    member = current_member()
    if member is None:
        return {"ok": False, "error": "not a member process"}
    return {
        "ok": expected_name is None or expected_name == member.name,
        "memberUuid": str(member.uuid),
        "name": member.name,
    }
