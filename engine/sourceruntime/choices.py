"""Every enumeration of the engine-managed Source runtime, named as the design names them."""

from __future__ import annotations

from enum import StrEnum


class Lane(StrEnum):
    """A pipeline's source runs in one lane for its whole life: restores never switch."""

    MANAGED = "A"  # the engine owns the reader's and enumerator's checkpoint-visible state
    LEGACY = "B"  # today's readers, unchanged


class AdmissionStatus(StrEnum):
    ACCEPTED = "ACCEPTED"
    DUPLICATE = "DUPLICATE"
    RETRY_LATER = "RETRY_LATER"
    STALE_TARGET = "STALE_TARGET"
    TERMINAL_REJECTED = "TERMINAL_REJECTED"
    UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"


class CommandKind(StrEnum):
    ASSIGN_SPLITS = "ASSIGN_SPLITS"
    NO_MORE_SPLITS = "NO_MORE_SPLITS"
    CHECKPOINT = "CHECKPOINT"  # a barrier: it takes a mailbox sequence like ordered controls
    CHECKPOINT_COMPLETE = "CHECKPOINT_COMPLETE"
    CHECKPOINT_ABORT = "CHECKPOINT_ABORT"
    ASSIGNMENT_ACK = "ASSIGNMENT_ACK"
    GRACEFUL_CLOSE = "GRACEFUL_CLOSE"
    REGISTER = "REGISTER"
    SPLIT_REQUEST = "SPLIT_REQUEST"
    SOURCE_EVENT = "SOURCE_EVENT"
    AVAILABLE = "AVAILABLE"
    DIAGNOSTIC = "DIAGNOSTIC"
    CANCEL = "CANCEL"
    FATAL = "FATAL"


class Durability(StrEnum):
    CHECKPOINT_COUPLED = "CHECKPOINT_COUPLED"  # split assignments: tracked until checkpointed
    RECONSTRUCTABLE = "RECONSTRUCTABLE"  # registration, split request, no-more-splits
    EPHEMERAL = "EPHEMERAL"  # availability, diagnostics
    TERMINAL = "TERMINAL"  # cancellation, fatal failure


class Category(StrEnum):
    """Reader scheduling categories, highest priority first."""

    TERMINAL = "TERMINAL"
    ORDERED_CONTROL = "ORDERED_CONTROL"
    ASYNC_COMPLETION = "ASYNC_COMPLETION"
    POLL = "POLL"
    OBSERVABILITY = "OBSERVABILITY"


class AssignmentState(StrEnum):
    UNASSIGNED = "UNASSIGNED"
    DISPATCHED = "DISPATCHED"
    ADMITTED = "ADMITTED"
    APPLIED = "APPLIED"
    CHECKPOINT_INCLUDED = "CHECKPOINT_INCLUDED"
    GC_ELIGIBLE = "GC_ELIGIBLE"


class PollStatus(StrEnum):
    MORE_AVAILABLE = "MORE_AVAILABLE"
    NOTHING_AVAILABLE = "NOTHING_AVAILABLE"
    END_OF_INPUT = "END_OF_INPUT"


#: The kind of each command: its durability class and scheduling category.
COMMANDS: dict[CommandKind, tuple[Durability, Category]] = {
    CommandKind.ASSIGN_SPLITS: (Durability.CHECKPOINT_COUPLED, Category.ORDERED_CONTROL),
    CommandKind.NO_MORE_SPLITS: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.CHECKPOINT: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.CHECKPOINT_COMPLETE: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.CHECKPOINT_ABORT: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.ASSIGNMENT_ACK: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.GRACEFUL_CLOSE: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.REGISTER: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.SPLIT_REQUEST: (Durability.RECONSTRUCTABLE, Category.ORDERED_CONTROL),
    CommandKind.SOURCE_EVENT: (Durability.EPHEMERAL, Category.ORDERED_CONTROL),
    CommandKind.AVAILABLE: (Durability.EPHEMERAL, Category.ASYNC_COMPLETION),
    CommandKind.DIAGNOSTIC: (Durability.EPHEMERAL, Category.OBSERVABILITY),
    CommandKind.CANCEL: (Durability.TERMINAL, Category.TERMINAL),
    CommandKind.FATAL: (Durability.TERMINAL, Category.TERMINAL),
}
#: Controls that may use the mailbox's reserved capacity (a full queue never blocks them).
RESERVED_KINDS = frozenset(
    {
        CommandKind.CHECKPOINT,
        CommandKind.GRACEFUL_CLOSE,
        CommandKind.CHECKPOINT_COMPLETE,
        CommandKind.CHECKPOINT_ABORT,
        CommandKind.ASSIGNMENT_ACK,
    }
)
