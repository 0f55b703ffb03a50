"""Engine events as the sentences the job page lists: one sentence per kind, built from its
payload (engine.events and engine.dirty.events shape them), so an operator reads what happened
rather than a payload. A kind this module does not know, or a payload missing what its sentence
needs (an event from an older version), still reads as a sentence from its keys and values.

Checkpoints are triggered and completed every few seconds: a run of them between other events is
one line per pipeline ("Checkpoints 31 to 60 of pipeline 1 completed").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: A long value (an error, a reason) in a sentence.
MAX_VALUE = 300
_RUN_KINDS = ("checkpoint.triggered", "checkpoint.completed")
DASH = "\N{EN DASH}"


@dataclass
class Line:
    """One line of the list: an event, or a run of checkpoint events of one pipeline."""

    kind: str
    text: str
    seq: int
    at: datetime | None
    first_seq: int | None = None
    first_at: datetime | None = None
    count: int = 1


def _v(value: Any) -> str:
    """A payload value as words: lists joined, mappings as ``key value`` pairs, cut short."""
    if isinstance(value, dict):
        text = ", ".join(f"{_words(str(k))} {_v(v)}" for k, v in value.items())
    elif isinstance(value, list | tuple):
        text = ", ".join(_v(v) for v in value)
    elif value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    else:
        text = str(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _words(name: str) -> str:
    """``memberEventSequence`` or ``restore-requested`` as ``member event sequence``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return re.sub(r"[-_.]+", " ", spaced).lower().strip()


def _because(payload: dict, key: str) -> str:
    return f": {_v(payload[key])}" if payload.get(key) else ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _group(payload: dict, names: dict[int, str]) -> str:
    tg = payload["taskGroupId"]
    return names.get(tg) or f"Task group {tg}"


def _job_submitted(p: dict, names: dict) -> str:
    return (
        f"Job “{_v(p['jobName'])}” submitted ({_v(p.get('mode', ''))}): "
        f"{_plural(int(p['pipelines']), 'pipeline')}, {_plural(int(p['slotsNeeded']), 'slot')}"
        " needed."
    )


def _job_status(p: dict, names: dict) -> str:
    return f"Job went from {p['from']} to {p['to']}{_because(p, 'errorMsg')}."


def _pipeline_status(p: dict, names: dict) -> str:
    return f"Pipeline {p['pipelineId']} went from {p['from']} to {p['to']}."


def _taskgroup_status(p: dict, names: dict) -> str:
    slot = f" in slot {p['slotId']}" if p.get("slotId") is not None else ""
    return (
        f"{_group(p, names)} (attempt {p['attempt']}) went from {p['from']} to {p['to']}"
        f"{slot}{_because(p, 'error')}."
    )


def _restore_requested(p: dict, names: dict) -> str:
    return (
        f"Restore {p['restore']} of pipeline {p['pipelineId']} requested, "
        f"in {_v(p['inSeconds'])} s."
    )


def _restore(p: dict, names: dict) -> str:
    start = (
        f"from checkpoint {p['fromCheckpoint']}"
        if p.get("fromCheckpoint") is not None
        else "from the start"
    )
    slots = f" into slots {_v(p['slots'])}" if p.get("slots") else ""
    cause = _because(p, "cause")
    return f"Pipeline {p['pipelineId']} restored {start}{slots} (restore {p['restore']}){cause}."


def _checkpoint(verb: str) -> Callable[[dict, dict], str]:
    def sentence(p: dict, names: dict) -> str:
        reason = _because(p, "reason")
        return f"Checkpoint {p['checkpointId']} of pipeline {p['pipelineId']} {verb}{reason}."

    return sentence


def _member_joined(p: dict, names: dict) -> str:
    return (
        f"Member {_v(p['name'])} joined at {_v(p.get('address', ''))} with "
        f"{_plural(int(p['slots']), 'slot')} ({_v(p.get('slotMode', ''))})."
    )


def _member_ended(verb: str) -> Callable[[dict, dict], str]:
    def sentence(p: dict, names: dict) -> str:
        kind = f" ({_v(p['classification'])})" if p.get("classification") else ""
        return f"Member {_v(p['name'])} {verb}{kind}{_because(p, 'reason')}."

    return sentence


def _drain_requested(p: dict, names: dict) -> str:
    return f"{_v(p['requestedBy'])} asked to drain member {_v(p['name'])}{_because(p, 'reason')}."


def _drained(p: dict, names: dict) -> str:
    moved = p.get("movedTaskGroups")
    moved_text = f", {_plural(int(moved), 'task group')} moved" if moved is not None else ""
    return (
        f"Drain of member {_v(p['name'])} ended {_v(p.get('state', ''))}{moved_text}"
        f"{_because(p, 'endReason')}."
    )


def _master_elected(p: dict, names: dict) -> str:
    return f"{_v(p['master'])} became the active master (pid {p['pid']} on {_v(p['host'])})."


def _master_resigned(p: dict, names: dict) -> str:
    return f"{_v(p['master'])} resigned as the active master."


def _history_failed(p: dict, names: dict) -> str:
    return (
        f"The finished-job record could not be written yet (it is retried){_because(p, 'error')}."
    )


def _incident(p: dict, names: dict) -> str:
    episode = "started" if p.get("episodeStarted") else "continues"
    return (
        f"Member {_v(p['lostMemberUuid'])} ({_v(p.get('lostAddress', ''))}) was lost "
        f"({_v(p.get('classification', ''))}): recovery episode {p['episodeId']} {episode}."
    )


def _attempt_prepared(p: dict, names: dict) -> str:
    return (
        f"Recovery attempt {_v(p['attemptId'])} of pipeline {p['pipelineId']} prepared "
        f"(episode {p['episodeId']})."
    )


def _attempt_confirmed(p: dict, names: dict) -> str:
    counted = "counted" if p.get("counted") else "not counted"
    return (
        f"Recovery attempt {_v(p['attemptId'])} confirmed (episode {p['episodeId']}, generation "
        f"{p['generation']}), {counted}: "
        f"{_plural(int(p['recoveryAttemptCount']), 'recovery attempt')} so far."
    )


def _attempt_aborted(p: dict, names: dict) -> str:
    return (
        f"Recovery attempt {_v(p['attemptId'])} of pipeline {p['pipelineId']} aborted "
        f"(restore {p['restore']}){_because(p, 'reason')}."
    )


def _marked(p: dict, names: dict) -> str:
    return (
        f"Job marked dirty: {_plural(int(p['recoveryAttemptCount']), 'recovery attempt')}, "
        f"over its threshold of {p['threshold']}."
    )


def _episode(verb: str) -> Callable[[dict, dict], str]:
    def sentence(p: dict, names: dict) -> str:
        return f"Recovery episode {p['episodeId']} {verb}{_because(p, 'reason')}."

    return sentence


def _tracking_incomplete(p: dict, names: dict) -> str:
    return f"Dirty-job tracking became incomplete{_because(p, 'reason')}."


def _tracker_failed(p: dict, names: dict) -> str:
    return f"The dirty-job tracker failed in {_v(p['where'])}{_because(p, 'error')}."


def _repaired(p: dict, names: dict) -> str:
    return f"Dirty-job tracking repaired {_plural(int(p['gaps']), 'gap')}."


def _snapshot(p: dict, names: dict) -> str:
    return (
        f"Recovery label kept in the job's history: {_v(p.get('evaluationStatus'))}, "
        f"{_plural(int(p.get('recoveryAttemptCount') or 0), 'recovery attempt')}."
    )


def _acknowledged(p: dict, names: dict) -> str:
    label = _v(p["evaluation"])
    return f"{_v(p['by'])} acknowledged the {label} recovery label{_because(p, 'reason')}."


SENTENCES: dict[str, Callable[[dict, dict], str]] = {
    "job.submitted": _job_submitted,
    "job.status": _job_status,
    "job.history-failed": _history_failed,
    "pipeline.status": _pipeline_status,
    "pipeline.restore-requested": _restore_requested,
    "pipeline.restore": _restore,
    "taskgroup.status": _taskgroup_status,
    "checkpoint.triggered": _checkpoint("triggered"),
    "checkpoint.completed": _checkpoint("completed"),
    "checkpoint.failed": _checkpoint("failed"),
    "member.joined": _member_joined,
    "member.left": _member_ended("left"),
    "member.removed": _member_ended("was removed"),
    "member.drain-requested": _drain_requested,
    "member.drained": _drained,
    "master.elected": _master_elected,
    "master.resigned": _master_resigned,
    "dirty.incident": _incident,
    "dirty.attempt-prepared": _attempt_prepared,
    "dirty.attempt-confirmed": _attempt_confirmed,
    "dirty.attempt-aborted": _attempt_aborted,
    "dirty.marked": _marked,
    "dirty.episode-completed": _episode("completed: the job runs again"),
    "dirty.episode-aborted": _episode("aborted"),
    "dirty.tracking-incomplete": _tracking_incomplete,
    "dirty.tracker-failed": _tracker_failed,
    "dirty.repaired": _repaired,
    "dirty.snapshot": _snapshot,
    "dirty.acknowledged": _acknowledged,
}


def generic(kind: str, payload: Any) -> str:
    """A readable sentence for any event: its kind in words, then its payload's pairs."""
    head = _words(kind).capitalize() or "Event"
    if isinstance(payload, dict) and payload:
        pairs = "; ".join(f"{_words(str(k))} {_v(v)}" for k, v in payload.items())
        return f"{head}: {pairs}."
    if payload not in (None, {}, [], ""):
        return f"{head}: {_v(payload)}."
    return f"{head}."


def sentence(kind: str, payload: Any, names: dict[int, str] | None = None) -> str:
    """The sentence of one event; ``names`` label task groups by id ("reader 1 of pipeline
    2")."""
    build = SENTENCES.get(kind)
    if build is not None and isinstance(payload, dict):
        try:
            return build(payload, names or {})
        except (KeyError, TypeError, ValueError):
            pass  # a payload without what the sentence needs: say what it has
    return generic(kind, payload)


def lines(events: Iterable, names: dict[int, str] | None = None) -> list[Line]:
    """The events (newest first, with ``kind``, ``payload``, ``seq``, ``at``) as lines, each
    run of checkpoint triggers and completions in a line per pipeline."""
    out: list[Line] = []
    run: list = []
    for event in events:
        if event.kind in _RUN_KINDS and isinstance(event.payload, dict):
            run.append(event)
            continue
        out += _run_lines(run, names)
        run = []
        out.append(
            Line(event.kind, sentence(event.kind, event.payload, names), event.seq, event.at)
        )
    return out + _run_lines(run, names)


def _run_lines(run: list, names: dict[int, str] | None) -> list[Line]:
    """A run of checkpoint events (newest first) as a line per pipeline; one event as itself."""
    if len(run) == 1:
        event = run[0]
        return [Line(event.kind, sentence(event.kind, event.payload, names), event.seq, event.at)]
    by_pipeline: dict[Any, list] = {}
    for event in run:
        by_pipeline.setdefault(event.payload.get("pipelineId"), []).append(event)
    out = []
    for pipeline, events in by_pipeline.items():
        done = [e.payload.get("checkpointId") for e in events if e.kind == _RUN_KINDS[1]]
        done = sorted(i for i in done if isinstance(i, int))
        triggered = [e.payload.get("checkpointId") for e in events if e.kind == _RUN_KINDS[0]]
        pending = sorted({i for i in triggered if isinstance(i, int)} - set(done))
        out.append(
            Line(
                "checkpoint.completed" if done else "checkpoint.triggered",
                _run_text(pipeline, done, pending),
                events[0].seq,
                events[0].at,
                first_seq=events[-1].seq,
                first_at=events[-1].at,
                count=len(events),
            )
        )
    return out


def _run_text(pipeline: Any, done: list[int], pending: list) -> str:
    parts = []
    if len(done) == 1:
        parts.append(f"Checkpoint {done[0]} of pipeline {pipeline} completed")
    elif done:
        parts.append(
            f"Checkpoints {done[0]}{DASH}{done[-1]} of pipeline {pipeline} completed "
            f"({len(done)} in all)"
        )
    if pending:
        ids = ", ".join(str(i) for i in pending)
        word = "checkpoint" if len(pending) == 1 else "checkpoints"
        if parts:
            parts.append(f"{word} {ids} triggered")
        else:
            parts.append(f"{word.capitalize()} {ids} of pipeline {pipeline} triggered")
    return "; ".join(parts) + "."
