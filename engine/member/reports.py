"""Group commit of a worker's reports: requests made by many task-group threads at once run as
one call, in one transaction.

When a storm's restores land on a worker, dozens of task groups start together and each used to
report RUNNING in a transaction of its own, every one of them a turn of the event-append lock.
Here the first thread to report while no report is being written becomes the leader: it writes
every report queued so far in one call, and the threads that queued meanwhile wait for their
answers, or lead the next call. One thread alone pays nothing: it leads a call of one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from engine.dbsession import session_lost

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Failed:
    """An answer that is an error: the caller it belongs to raises it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class GroupCommit(Generic[K, V]):
    """``commit(key)`` answers ``run([key, ...])[key]``, where one call of ``run`` serves every
    key queued while the previous call ran. ``run`` answers every key it is given (a key
    missing from its answer gets ``default``); if it raises, each key is run alone, and a
    caller whose key still raises gets that error and decides whether to try again
    (engine.dbsession.ride_out)."""

    def __init__(self, run: Callable[[list[K]], dict[K, V]], default: V) -> None:
        self._run = run
        self._default = default
        self._cond = threading.Condition()
        self._queued: list[tuple[object, K]] = []
        self._answers: dict[object, V | _Failed] = {}
        self._busy = False

    def commit(self, key: K) -> V:
        ticket = object()
        with self._cond:
            self._queued.append((ticket, key))
            while ticket not in self._answers and self._busy:
                self._cond.wait()
            batch: list[tuple[object, K]] = []
            if ticket not in self._answers:  # nobody is writing: lead, with all that is queued
                self._busy = True
                batch, self._queued = self._queued, []
        if batch:
            self._lead(batch)
        with self._cond:
            answer = self._answers.pop(ticket)
        if isinstance(answer, _Failed):
            raise answer.error
        return answer

    def _lead(self, batch: list[tuple[object, K]]) -> None:
        keys = list(dict.fromkeys(key for _, key in batch))
        by_key: dict[K, V | _Failed] = {}
        try:
            try:
                result = self._run(keys)
                by_key = {key: result.get(key, self._default) for key in keys}
            except Exception as exc:
                if len(keys) == 1 or session_lost(exc):
                    raise  # the database is away: every caller rides it out on its own
                # One bad report must not fail the others for ever (each retries, and would
                # meet it in every write): each is written alone, and only its own error stays.
                for key in keys:
                    try:
                        by_key[key] = self._run([key]).get(key, self._default)
                    except Exception as exc:
                        by_key[key] = _Failed(exc)
        except BaseException as exc:  # every waiter gets it; none waits for ever
            by_key = dict.fromkeys(keys, _Failed(exc))
        with self._cond:
            self._answers.update({ticket: by_key[key] for ticket, key in batch})
            self._busy = False
            self._cond.notify_all()
