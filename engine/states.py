"""Explicit state machines of the engine: constants, named terminal sets, validated transitions."""

from __future__ import annotations

from django.db import models


class InvalidTransition(ValueError):
    """A state change that the state machine does not allow."""


class MemberState(models.TextChoices):
    ALIVE = "ALIVE"
    #: Declared dead by the active master (heartbeat timeout or its database session ended).
    REMOVED = "REMOVED"
    #: Stopped gracefully (SIGTERM) and said so itself.
    LEFT = "LEFT"


MEMBER_TERMINAL = frozenset({MemberState.REMOVED, MemberState.LEFT})
MEMBER_TRANSITIONS = {
    MemberState.ALIVE: frozenset({MemberState.REMOVED, MemberState.LEFT}),
    MemberState.REMOVED: frozenset(),
    MemberState.LEFT: frozenset(),
}


class SlotMode(models.TextChoices):
    FIXED = "FIXED"
    DYNAMIC = "DYNAMIC"


class SlotState(models.TextChoices):
    FREE = "FREE"
    ASSIGNED = "ASSIGNED"


class CandidateState(models.TextChoices):
    ACTIVE = "ACTIVE"
    STANDBY = "STANDBY"
    STOPPED = "STOPPED"


def check_transition(table: dict, current: str, target: str) -> None:
    """Raise InvalidTransition unless ``current -> target`` is an edge of ``table``."""
    if target not in table.get(current, frozenset()):
        raise InvalidTransition(f"{current} -> {target} is not a valid transition")
