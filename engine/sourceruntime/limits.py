"""The runtime's bounds, from the engine options (``engine.source-runtime.*``): read once
when a reader starts, never from a connector's config."""

from __future__ import annotations

from dataclasses import dataclass


def _engine() -> dict:
    from django.conf import settings

    return settings.ENGINE


@dataclass(frozen=True)
class MailboxLimits:
    max_commands: int = 1024
    max_bytes: int = 4 * 1024 * 1024
    reserved_commands: int = 64
    reserved_bytes: int = 256 * 1024
    max_payload: int = 512 * 1024
    retry_after: float = 0.010

    @classmethod
    def from_settings(cls) -> MailboxLimits:
        engine = _engine()
        return cls(
            max_commands=engine["source-runtime.mailbox.max-commands"],
            max_bytes=engine["source-runtime.mailbox.max-bytes"],
            reserved_commands=engine["source-runtime.mailbox.reserved-commands"],
            reserved_bytes=engine["source-runtime.mailbox.reserved-bytes"],
            max_payload=engine["source-runtime.command.max-payload-bytes"],
            retry_after=engine["source-runtime.retry.initial-backoff"],
        )


@dataclass(frozen=True)
class PollLimits:
    max_records: int = 64
    max_bytes: int = 4 * 1024 * 1024
    soft: float = 0.005
    hard: float = 1.0

    @classmethod
    def from_settings(cls) -> PollLimits:
        engine = _engine()
        return cls(
            max_records=engine["source-runtime.poll.max-records"],
            max_bytes=engine["source-runtime.mailbox.max-bytes"],
            soft=engine["source-runtime.poll.soft-duration"],
            hard=engine["source-runtime.poll.hard-duration"],
        )
