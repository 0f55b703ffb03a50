"""A managed reader's availability, returned to its event loop as an ``AVAILABLE`` command.

A reader whose poll found nothing may say when it will have more with ``is_available()``: a
``concurrent.futures.Future`` done once a poll is worth making (a paced reader's: when rows come
due, on the shared timers of engine.sourceruntime.timers). Its completion, on whatever thread
completes it, admits one ``AVAILABLE`` command (EPHEMERAL, ASYNC_COMPLETION) into the reader's own
mailbox, which wakes the loop; the loop sets ``available`` when it applies it and polls.

- **No lost wakeup.** The loop marks itself unavailable before it asks for the future, and a
  done-callback added to a future already done runs at once: a completion between the poll and
  the wait is in the mailbox before the loop waits, and the admission sets its wakeup.
- **Bounded and coalesced.** Every completion is admitted under one command id, so at most one
  is pending; one more while it waits is a DUPLICATE (counted ``coalesced``). One coalesced while
  the pending one is being applied is covered by it: the apply sets ``available`` and the poll
  that follows comes after the completion.
- **Never lost to a full mailbox.** A completion refused for capacity (RETRY_LATER) sets a flag
  the loop reads at its next step (counted ``refused``), and wakes it.
- **Fallback.** A reader without ``is_available`` keeps the loop's own timer on its ``retry_at``.
- **Nothing after the end.** Once the loop ends (closed, cancelled, failed) ``close()`` cancels
  the future awaited, so its reader drops what would complete it (the paced FakeSource reader
  its timer), and a completion that comes anyway admits nothing into a mailbox nobody reads.

Its sender id (``AVAILABILITY_SENDER``) is below every coordinator epoch, so it takes no part in
the checkpointed applied watermarks; nothing of it is ever in a checkpoint.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Any

from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.mailbox import ReaderMailbox

#: The sender id of availability completions (the worker's checkpoint sequencer has 0 and -1,
#: a drain's graceful close -3).
AVAILABILITY_SENDER = -2
#: The one command id every completion is admitted under (at most one pending).
COMMAND_ID = CommandKind.AVAILABLE.value


class Availability:
    def __init__(self, mailbox: ReaderMailbox) -> None:
        self.mailbox = mailbox
        self.awaited: Future | None = None  # the newest future a done-callback was added to
        self._sequence = itertools.count()
        self.missed = False  # a completion the mailbox refused: the loop polls anyway
        self.closed = False  # the loop ended: completions admit nothing
        #: AVAILABLE commands applied by the loop (its wakeups), completions admitted, coalesced
        #: into the pending one, and refused for capacity.
        self.wakeups = self.admitted = self.coalesced = self.refused = 0

    def await_reader(self, reader: Any) -> float | None:
        """After a poll that found nothing (on the loop's thread, once it is unavailable): the
        reader's availability future awaited, or, for a reader without ``is_available``, its
        ``retry_at`` for the loop's own timer (None: none)."""
        is_available = getattr(reader, "is_available", None)
        if is_available is None:
            return getattr(reader, "retry_at", None)
        future = is_available()
        if future is not self.awaited:  # a future asked for again is awaited once
            self.awaited = future
            future.add_done_callback(self.completed)  # at once if it is done already
        return None

    def completed(self, future: Future | None = None) -> None:
        """A completion, on any thread: one AVAILABLE command admitted (or coalesced)."""
        if self.closed:
            return
        mailbox = self.mailbox
        for _ in range(3):  # an epoch that moved on meanwhile: again with the newer one
            envelope = SourceCommandEnvelope.build(
                job_id=mailbox.job_id,
                source_runtime_id=mailbox.runtime_id,
                epoch=mailbox.epoch,
                sender_attempt=AVAILABILITY_SENDER,
                target_attempt=mailbox.attempt,
                sequence=next(self._sequence),
                command_id=COMMAND_ID,
                kind=CommandKind.AVAILABLE,
            )
            ack = mailbox.admit(envelope)
            if ack.reasonCode != "STALE_EPOCH":
                break
        if ack.status == AdmissionStatus.ACCEPTED:
            self.admitted += 1
        elif ack.status == AdmissionStatus.DUPLICATE:
            self.coalesced += 1
        elif ack.status != AdmissionStatus.TERMINAL_REJECTED:
            self.refused += 1
            self.missed = True
            mailbox.wakeup()

    def close(self) -> None:
        """The loop ended (on its thread): the future awaited is cancelled (its reader may
        release what would complete it), and no completion is admitted any more."""
        self.closed = True
        if self.awaited is not None:
            self.awaited.cancel()  # its done-callback runs now, and admits nothing

    def take_missed(self) -> bool:
        """Whether a refused completion is to be acted on (cleared as it is read)."""
        if not self.missed:
            return False
        self.missed = False
        return True

    def metrics(self) -> dict:
        return {
            "wakeups": self.wakeups,
            "admitted": self.admitted,
            "coalesced": self.coalesced,
            "refused": self.refused,
        }
