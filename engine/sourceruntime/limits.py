"""The runtime's bounds, from the engine options (``engine.source-runtime.*``): read once
when a reader starts, never from a connector's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def _from_engine(cls: type[T], options: dict[str, str]) -> T:
    """``cls`` with each field (a key of ``options``) the engine option it names."""
    from django.conf import settings

    engine = settings.ENGINE
    return cls(**{name: engine[f"source-runtime.{option}"] for name, option in options.items()})


@dataclass(frozen=True)
class MailboxLimits:
    max_commands: int = 1024
    max_bytes: int = 4 * 1024 * 1024
    reserved_commands: int = 64
    reserved_bytes: int = 256 * 1024
    max_payload: int = 512 * 1024
    retry_after: float = 0.010
    #: The admission latency objective: a p99 above it is logged, admissions over it counted.
    p99_budget: float = 0.005

    @classmethod
    def from_settings(cls) -> MailboxLimits:
        return _from_engine(
            cls,
            {
                "max_commands": "mailbox.max-commands",
                "max_bytes": "mailbox.max-bytes",
                "reserved_commands": "mailbox.reserved-commands",
                "reserved_bytes": "mailbox.reserved-bytes",
                "max_payload": "command.max-payload-bytes",
                "retry_after": "retry.initial-backoff",
                "p99_budget": "admission.p99-budget",
            },
        )


@dataclass(frozen=True)
class PollLimits:
    """A poll turn's bounds; a call past ``hard`` is woken by the watchdog, and one that has not
    returned ``cancellation_timeout`` after its wakeup fails its task group."""

    max_records: int = 64
    schema_change_timeout: float = 60.0  # from a schema change's request until it applied
    max_bytes: int = 4 * 1024 * 1024
    soft: float = 0.005
    hard: float = 1.0
    cancellation_timeout: float = 30.0

    @classmethod
    def from_settings(cls) -> PollLimits:
        return _from_engine(
            cls,
            {
                "max_records": "poll.max-records",
                "max_bytes": "mailbox.max-bytes",
                "soft": "poll.soft-duration",
                "hard": "poll.hard-duration",
                "cancellation_timeout": "poll.cancellation-timeout",
                "schema_change_timeout": "schema-change.timeout",
            },
        )
