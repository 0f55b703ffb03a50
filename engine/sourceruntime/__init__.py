"""The engine-managed Source runtime (Lane A) beside today's readers (Lane B): lanes and
capabilities, the versioned command envelope, the bounded reader mailbox."""

from __future__ import annotations

from engine.sourceruntime.capability import (
    LEGACY,
    LaneMismatch,
    ManagedSourceCapability,
    SourceRuntime,
    check_restore,
    choose,
)
from engine.sourceruntime.choices import AdmissionStatus, CommandKind, Lane
from engine.sourceruntime.envelope import AdmissionAck, SourceCommandEnvelope
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget

__all__ = [
    "LEGACY",
    "AdmissionAck",
    "AdmissionStatus",
    "CommandKind",
    "Lane",
    "LaneMismatch",
    "MailboxLimits",
    "ManagedSourceCapability",
    "PollLimits",
    "ReaderMailbox",
    "SourceCommandEnvelope",
    "SourceRuntime",
    "WorkerBudget",
    "check_restore",
    "choose",
]
