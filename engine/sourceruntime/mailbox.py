"""The bounded reader mailbox: where operation threads (Celery handler threads) hand commands
to a managed reader's event loop.

Admission validates and enqueues only: it never runs connector code, never sleeps or waits, and
answers in the design's order (protocol, target attempt and epoch, terminal state, header and
payload, duplicates, capacity, sequence, publication). Capacity is bounded three ways (commands
and payload bytes per mailbox, payload bytes per worker process), with capacity reserved for
checkpoint-path controls; the terminal signal (cancel, fatal failure) lives outside the queue so
it always gets through. The queue itself is never checkpointed: what a checkpoint keeps is the
applied watermarks (``watermarks()``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.sourceruntime.admission import AdmissionLatency
from engine.sourceruntime.choices import (
    COMMANDS,
    RESERVED_KINDS,
    AdmissionStatus,
    Category,
    CommandKind,
)
from engine.sourceruntime.envelope import PROTOCOL_VERSION, AdmissionAck, SourceCommandEnvelope
from engine.sourceruntime.limits import MailboxLimits


class WorkerBudget:
    """Payload bytes queued in every managed mailbox of one worker process."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self.used + size > self.max_bytes:
                return False
            self.used += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self.used -= size


@dataclass
class Queued:
    """An admitted command waiting for the event loop."""

    sequence: int
    envelope: SourceCommandEnvelope
    category: Category
    admitted_at: float
    reserved: bool  # admitted into the reserved capacity


@dataclass
class SenderWatermark:
    """Sequences of one sender applied: every one up to ``upto``, and those above it."""

    upto: int = -1
    above: set[int] = field(default_factory=set)

    def add(self, sequence: int) -> None:
        self.above.add(sequence)
        while self.upto + 1 in self.above:
            self.upto += 1
            self.above.remove(self.upto)

    def covers(self, sequence: int) -> bool:
        return sequence <= self.upto or sequence in self.above

    def skip_to(self, sequence: int) -> None:
        """Every sequence below ``sequence`` is settled: its sender started this attempt's
        sequences there (after reconciling it), so the gaps below will never be filled."""
        self.upto = max(self.upto, sequence - 1)
        self.above = {s for s in self.above if s > self.upto}
        while self.upto + 1 in self.above:  # what now follows the watermark joins it
            self.upto += 1
            self.above.remove(self.upto)


class TerminalSignal:
    """Cancel or fatal failure: set once, atomically, outside the queue's capacity."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.kind: CommandKind | None = None
        self.reason: str | None = None

    def set(self, kind: CommandKind, reason: str) -> bool:
        with self._lock:
            if self.kind is not None:
                return False
            self.kind, self.reason = kind, reason
            return True

    def __bool__(self) -> bool:
        return self.kind is not None


class ReaderMailbox:
    def __init__(
        self,
        job_id: int,
        runtime_id: str,
        attempt: int,
        limits: MailboxLimits,
        budget: WorkerBudget,
        wakeup: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        epoch: int = 0,
    ) -> None:
        self.job_id, self.runtime_id, self.attempt = job_id, runtime_id, attempt
        self.limits, self.budget, self.wakeup, self.clock = limits, budget, wakeup, clock
        self.epoch = epoch  # the newest coordinator epoch seen: older senders are fenced
        self.terminal = TerminalSignal()
        self._lock = threading.Lock()
        self._sequence = 0
        self._ordered: deque[Queued] = deque()
        self._completions: OrderedDict[str, Queued] = OrderedDict()  # coalesced by command id
        self._observability: deque[Queued] = deque(maxlen=16)  # droppable
        self._pending: dict[str, int] = {}  # command id -> mailbox sequence, until applied
        self.watermarks_by_sender: dict[int, SenderWatermark] = {}
        self.commands = 0
        self.bytes = 0
        self.reserved_commands = 0
        self.reserved_bytes = 0
        self.admissions: Counter[str] = Counter()
        #: How long ``admit`` takes, against ``admission.p99-budget``.
        self.latency = AdmissionLatency(limits.p99_budget)
        #: Told when the terminal signal is raised (the reader event loop wakes a poll call in
        #: progress), on the thread that raised it.
        self.on_terminal: Callable[[], None] = lambda: None

    # -- admission (operation threads) -----------------------------------------------------

    def admit(self, envelope: SourceCommandEnvelope) -> AdmissionAck:
        started = self.clock()
        ack = self._admit(envelope)
        self.admissions[ack.status.value] += 1
        if ack.status == AdmissionStatus.ACCEPTED:
            self.wakeup()
        elif ack.reasonCode == "RESERVED_CAPACITY_EXHAUSTED":
            self.on_terminal()  # the fatal failure raised under the lock: a poll call ends
            self.wakeup()
        self.latency.record(self.clock() - started)
        return ack

    def _admit(self, env: SourceCommandEnvelope) -> AdmissionAck:
        def answer(status: AdmissionStatus, **kw) -> AdmissionAck:
            return AdmissionAck(status, self.attempt, **kw)

        if env.protocolVersion != PROTOCOL_VERSION:
            return answer(AdmissionStatus.UNSUPPORTED_PROTOCOL, reasonCode="PROTOCOL_MAJOR")
        if env.jobId != self.job_id or env.sourceRuntimeId != self.runtime_id:
            return answer(AdmissionStatus.STALE_TARGET, reasonCode="WRONG_RUNTIME")
        if env.targetAttemptId != self.attempt:
            return answer(AdmissionStatus.STALE_TARGET, reasonCode="STALE_ATTEMPT")
        problem = env.header_problem(self.limits.max_payload)
        if problem is not None:
            return answer(AdmissionStatus.INVALID_PAYLOAD, reasonCode=problem)
        kind = env.kind
        if COMMANDS[kind][1] == Category.TERMINAL:
            self.signal_terminal(kind, "COMMAND")
            return answer(AdmissionStatus.ACCEPTED)
        with self._lock:
            if env.coordinatorEpoch < self.epoch:
                return answer(AdmissionStatus.STALE_TARGET, reasonCode="STALE_EPOCH")
            if self.terminal:
                return answer(AdmissionStatus.TERMINAL_REJECTED, reasonCode=self.terminal.reason)
            self.epoch = env.coordinatorEpoch
            if env.commandId in self._pending:
                return answer(
                    AdmissionStatus.DUPLICATE, mailboxSequence=self._pending[env.commandId]
                )
            watermark = self.watermarks_by_sender.get(env.senderAttemptId)
            if watermark is not None and watermark.covers(env.senderSequence):
                return answer(AdmissionStatus.DUPLICATE, reasonCode="APPLIED")
            if (  # the gaps are bounded: past max-commands of them, only one that fills
                watermark is not None
                and len(watermark.above) >= self.limits.max_commands
                and env.senderSequence != watermark.upto + 1
                and kind != CommandKind.REGISTER
            ):
                return answer(
                    AdmissionStatus.RETRY_LATER,
                    retryAfterMillis=max(1, round(self.limits.retry_after * 1000)),
                    reasonCode="SEQUENCE_GAPS",
                )
            reserved = self._reserve(kind, env.payloadBytes)
            if reserved is None:
                if kind in RESERVED_KINDS:  # an invariant violation: the task fails
                    self.terminal.set(CommandKind.FATAL, "RESERVED_CAPACITY_EXHAUSTED")
                    return answer(
                        AdmissionStatus.TERMINAL_REJECTED, reasonCode="RESERVED_CAPACITY_EXHAUSTED"
                    )
                return answer(
                    AdmissionStatus.RETRY_LATER,
                    retryAfterMillis=max(1, round(self.limits.retry_after * 1000)),
                    reasonCode="MAILBOX_FULL",
                )
            self._sequence += 1
            queued = Queued(self._sequence, env, COMMANDS[kind][1], self.clock(), reserved)
            self._pending[env.commandId] = queued.sequence
            self._publish(queued)
            return answer(AdmissionStatus.ACCEPTED, mailboxSequence=queued.sequence)

    def _reserve(self, kind: CommandKind, size: int) -> bool | None:
        """True (reserved capacity), False (normal capacity) or None (none left)."""
        lim = self.limits
        normal_commands = lim.max_commands - lim.reserved_commands
        normal_bytes = lim.max_bytes - lim.reserved_bytes
        unreserved = self.commands - self.reserved_commands
        unreserved_bytes = self.bytes - self.reserved_bytes
        if (
            unreserved < normal_commands
            and unreserved_bytes + size <= normal_bytes
            and self.budget.reserve(size)
        ):
            self.commands += 1
            self.bytes += size
            return False
        if (
            kind in RESERVED_KINDS
            and self.reserved_commands < lim.reserved_commands
            and self.reserved_bytes + size <= lim.reserved_bytes
        ):
            self.commands += 1
            self.bytes += size
            self.reserved_commands += 1
            self.reserved_bytes += size
            return True
        return None

    def _publish(self, queued: Queued) -> None:
        if queued.category == Category.ORDERED_CONTROL:
            self._ordered.append(queued)
        elif queued.category == Category.ASYNC_COMPLETION:
            self._completions[queued.envelope.commandId] = queued
        else:
            if len(self._observability) == self._observability.maxlen:
                self._release(self._observability[0])
            self._observability.append(queued)

    def signal_terminal(self, kind: CommandKind, reason: str) -> bool:
        """Cancel or fatal failure: preempts everything queued; the reader's ``wakeup()``
        is called so a poll in progress returns."""
        first = self.terminal.set(kind, reason)
        self.on_terminal()
        self.wakeup()
        return first

    # -- the event loop --------------------------------------------------------------------

    def take(self) -> Queued | None:
        """The next command by category (ordered controls in sequence order first, then
        async completions, then observability); its capacity is released."""
        with self._lock:
            if self._ordered:
                queued = self._ordered.popleft()
            elif self._completions:
                queued = self._completions.popitem(last=False)[1]
            elif self._observability:
                queued = self._observability.popleft()
            else:
                return None
            self._release(queued)
            return queued

    def has_work(self) -> bool:
        """Anything for the event loop besides polling (read without the lock: a command
        admitted just after is seen at the next check, one turn later at most). ``commands``
        counts what is queued, in every category: the poll turns' hot path reads it inline."""
        return self.commands > 0 or self.terminal.kind is not None

    def next_ordered_kind(self) -> CommandKind | None:
        """The kind of the ordered control the event loop takes next, if any."""
        with self._lock:
            return self._ordered[0].envelope.kind if self._ordered else None

    def applied(self, envelope: SourceCommandEnvelope) -> None:
        """The event loop applied it: a redelivery is a DUPLICATE from now on. Senders below 1
        are the worker's own checkpoint sequencer (barriers and their callbacks, deduplicated
        by checkpoint id before admission): their sequences restart with every attempt, so
        they take no part in the checkpointed watermarks."""
        with self._lock:
            self._pending.pop(envelope.commandId, None)
            sender = envelope.senderAttemptId
            if sender < 1:
                return
            watermark = self.watermarks_by_sender.setdefault(sender, SenderWatermark())
            if envelope.kind == CommandKind.REGISTER:  # its sender's first to this attempt
                watermark.skip_to(envelope.senderSequence)
            watermark.add(envelope.senderSequence)
            # An older coordinator epoch is fenced (STALE_EPOCH) and its assignments were
            # reconciled before this one sent anything: its watermark proves nothing any more.
            for older in [s for s in self.watermarks_by_sender if s < sender]:
                del self.watermarks_by_sender[older]

    def _release(self, queued: Queued) -> None:
        size = queued.envelope.payloadBytes
        self.commands -= 1
        self.bytes -= size
        if queued.reserved:
            self.reserved_commands -= 1
            self.reserved_bytes -= size
        else:
            self.budget.release(size)

    # -- checkpoint metadata and metrics ---------------------------------------------------

    def watermarks(self) -> dict[str, dict]:
        """Applied sender watermarks with their bounded gaps, for the runtime metadata."""
        with self._lock:
            return {
                str(sender): {"upto": w.upto, "above": sorted(w.above)}
                for sender, w in self.watermarks_by_sender.items()
            }

    def restore_watermarks(self, data: dict[str, dict]) -> None:
        with self._lock:
            self.watermarks_by_sender = {
                int(sender): SenderWatermark(w["upto"], set(w["above"]))
                for sender, w in data.items()
            }

    def stats(self) -> dict:
        with self._lock:
            queued = [*self._ordered, *self._completions.values(), *self._observability]
            oldest = min((q.admitted_at for q in queued), default=None)
            return {
                "commands": self.commands,
                "bytes": self.bytes,
                "reservedInUse": self.reserved_commands,
                "oldestAgeMs": 0 if oldest is None else round((self.clock() - oldest) * 1000),
                "admissions": dict(self.admissions),
            }
