"""Engine events as the sentences the job page lists: one sentence per kind, built from its
payload (engine.events and engine.dirty.events shape them), so an operator reads what happened
rather than a payload. A kind this module does not know, or a payload missing what its sentence
needs (an event from an older version), still reads as a sentence from its keys and values.

Statuses read as lower-case words, members by name (a UUID cut to its first 8 characters), and
never by the database ids of slots, which mean nothing beside the per-worker slot numbers the
page shows. Triggered and completed checkpoints are not in the list (``LEFT_OUT``: the page has
a section for them); a run of failed ones is one line per pipeline ("Checkpoints 31 to 60 of
pipeline 1 failed", with an en dash).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.models import EngineEvent
from engine.models.events import CHECKPOINT_PROGRESS_KINDS

#: A long value (an error, a reason) in a sentence.
MAX_VALUE = 300
#: A restore's cause: its first line, cut to this length.
MAX_CAUSE = 160
#: The kinds the job page's list leaves out, in its query (dashboard.job_sections).
LEFT_OUT = CHECKPOINT_PROGRESS_KINDS  # the kinds the events' partial index leaves out
_RUN_KIND = "checkpoint.failed"
DASH = "\N{EN DASH}"
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)


@dataclass
class Line:
    """One line of the list: an event, or a run of failed checkpoints of one pipeline."""

    kind: str
    text: str
    seq: int
    at: datetime | None
    first_seq: int | None = None
    first_at: datetime | None = None
    count: int = 1


@dataclass(frozen=True)
class Context:
    """What a sentence may name beyond its payload: task groups by id ("reader 1 of pipeline
    2"), and the member the event was recorded with (its ``member``), by name."""

    names: dict[int, str] = field(default_factory=dict)
    member: str | None = None


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


def _state(value: Any) -> str:
    """A status or a classification (``FAILING``, ``UNPLANNED``) as a word: ``failing``."""
    return _words(str(value))


def _because(payload: dict, key: str) -> str:
    return f": {_v(payload[key])}" if payload.get(key) else ""


def _brief(text: Any, limit: int = MAX_CAUSE) -> str:
    """A cause in a few words: its first line, cut at a word before ``limit`` characters."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    if len(first) <= limit:
        return first
    cut = first[: limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2 :] else cut) + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _group(payload: dict, c: Context) -> str:
    tg = payload["taskGroupId"]
    name = c.names.get(tg) or f"task group {tg}"
    return name[:1].upper() + name[1:]


def _job_submitted(p: dict, c: Context) -> str:
    return (
        f"Job “{_v(p['jobName'])}” submitted ({_state(p.get('mode', ''))}): "
        f"{_plural(int(p['pipelines']), 'pipeline')}, {_plural(int(p['slotsNeeded']), 'slot')}"
        " needed."
    )


def _job_status(p: dict, c: Context) -> str:
    return f"Job went from {_state(p['from'])} to {_state(p['to'])}{_because(p, 'errorMsg')}."


def _pipeline_status(p: dict, c: Context) -> str:
    return f"Pipeline {p['pipelineId']} went from {_state(p['from'])} to {_state(p['to'])}."


def _taskgroup_status(p: dict, c: Context) -> str:
    where = f" on {c.member}" if c.member else ""
    return (
        f"{_group(p, c)} (attempt {p['attempt']}) went from {_state(p['from'])} to "
        f"{_state(p['to'])}{where}{_because(p, 'error')}."
    )


def _restored(p: dict, c: Context) -> str:
    """What a restore redeploys: the pipeline, or a reader restore's readers by name."""
    groups = p.get("taskGroups")
    if groups is None:
        return f"Pipeline {p['pipelineId']}"
    text = ", ".join(c.names.get(tg) or f"task group {tg}" for tg in groups)
    return text[:1].upper() + text[1:]


def _restore_requested(p: dict, c: Context) -> str:
    of = f" of pipeline {p['pipelineId']}" if p.get("taskGroups") is not None else ""
    return (
        f"{_restored(p, c)} will be restored in {_v(p['inSeconds'])} s "
        f"(restore {p['restore']}{of})."
    )


def _restore_withdrawn(p: dict, c: Context) -> str:
    whom = _restored(p, c)
    return (
        f"The restore of {whom[:1].lower() + whom[1:]} (restore {p['restore']} of pipeline "
        f"{p['pipelineId']}) was withdrawn{_because(p, 'reason')}."
    )


def _rescale_refused(p: dict, c: Context) -> str:
    return (
        f"The rescale of pipeline {p['pipelineId']} to {p['parallelism']} readers was "
        f"refused{_because(p, 'reason')}."
    )


def _restore(p: dict, c: Context) -> str:
    start = (
        f"from checkpoint {p['fromCheckpoint']}"
        if p.get("fromCheckpoint") is not None
        else "from the start"
    )
    slots = f" onto {_plural(len(p['slots']), 'slot')}" if p.get("slots") else ""
    cause = f": {_brief(p['cause'])}" if str(p.get("cause") or "").strip() else ""
    return f"{_restored(p, c)} restored {start}{slots} (restore {p['restore']}){cause}."


def _checkpoint(verb: str) -> Callable[[dict, Context], str]:
    def sentence(p: dict, c: Context) -> str:
        reason = _because(p, "reason")
        return f"Checkpoint {p['checkpointId']} of pipeline {p['pipelineId']} {verb}{reason}."

    return sentence


def _member_joined(p: dict, c: Context) -> str:
    return (
        f"Member {_v(p['name'])} joined at {_v(p.get('address', ''))} with "
        f"{_plural(int(p['slots']), 'slot')} ({_state(p.get('slotMode', ''))})."
    )


def _member_ended(verb: str) -> Callable[[dict, Context], str]:
    def sentence(p: dict, c: Context) -> str:
        kind = f" ({_state(p['classification'])})" if p.get("classification") else ""
        return f"Member {_v(p['name'])} {verb}{kind}{_because(p, 'reason')}."

    return sentence


def _drain_requested(p: dict, c: Context) -> str:
    return f"{_v(p['requestedBy'])} asked to drain member {_v(p['name'])}{_because(p, 'reason')}."


def _drained(p: dict, c: Context) -> str:
    moved = p.get("movedTaskGroups")
    moved_text = f", {_plural(int(moved), 'task group')} moved" if moved is not None else ""
    return (
        f"Drain of member {_v(p['name'])} ended {_state(p.get('state', ''))}{moved_text}"
        f"{_because(p, 'endReason')}."
    )


def _master_elected(p: dict, c: Context) -> str:
    return f"{_v(p['master'])} became the active master (pid {p['pid']} on {_v(p['host'])})."


def _master_resigned(p: dict, c: Context) -> str:
    return f"{_v(p['master'])} resigned as the active master."


def _history_failed(p: dict, c: Context) -> str:
    return (
        f"The finished-job record could not be written yet (it is retried){_because(p, 'error')}."
    )


def _incident(p: dict, c: Context) -> str:
    episode = "started" if p.get("episodeStarted") else "continues"
    return (
        f"Member {_v(p['lostMemberUuid'])} ({_v(p.get('lostAddress', ''))}) was lost "
        f"({_state(p.get('classification', ''))}): recovery episode {p['episodeId']} {episode}."
    )


def _attempt_prepared(p: dict, c: Context) -> str:
    return (
        f"Recovery attempt {_v(p['attemptId'])} of pipeline {p['pipelineId']} prepared "
        f"(episode {p['episodeId']})."
    )


def _attempt_confirmed(p: dict, c: Context) -> str:
    counted = "counted" if p.get("counted") else "not counted"
    return (
        f"Recovery attempt {_v(p['attemptId'])} confirmed (episode {p['episodeId']}, generation "
        f"{p['generation']}), {counted}: "
        f"{_plural(int(p['recoveryAttemptCount']), 'recovery attempt')} so far."
    )


def _attempt_aborted(p: dict, c: Context) -> str:
    return (
        f"Recovery attempt {_v(p['attemptId'])} of pipeline {p['pipelineId']} aborted "
        f"(restore {p['restore']}){_because(p, 'reason')}."
    )


def _marked(p: dict, c: Context) -> str:
    return (
        f"Job marked dirty: {_plural(int(p['recoveryAttemptCount']), 'recovery attempt')}, "
        f"over its threshold of {p['threshold']}."
    )


def _episode(verb: str) -> Callable[[dict, Context], str]:
    def sentence(p: dict, c: Context) -> str:
        return f"Recovery episode {p['episodeId']} {verb}{_because(p, 'reason')}."

    return sentence


def _tracking_incomplete(p: dict, c: Context) -> str:
    return f"Dirty-job tracking became incomplete{_because(p, 'reason')}."


def _tracker_failed(p: dict, c: Context) -> str:
    return f"The dirty-job tracker failed in {_v(p['where'])}{_because(p, 'error')}."


def _repaired(p: dict, c: Context) -> str:
    return f"Dirty-job tracking repaired {_plural(int(p['gaps']), 'gap')}."


def _snapshot(p: dict, c: Context) -> str:
    return (
        f"Dirty-job label kept in the job's history: {_v(p.get('evaluationStatus'))}, "
        f"{_plural(int(p.get('recoveryAttemptCount') or 0), 'recovery attempt')}."
    )


def _acknowledged(p: dict, c: Context) -> str:
    label = _v(p["evaluation"])
    return f"{_v(p['by'])} acknowledged the {label} dirty-job label{_because(p, 'reason')}."


SENTENCES: dict[str, Callable[[dict, Context], str]] = {
    "job.submitted": _job_submitted,
    "job.status": _job_status,
    "job.history-failed": _history_failed,
    "pipeline.status": _pipeline_status,
    "pipeline.restore-requested": _restore_requested,
    "pipeline.restore": _restore,
    "pipeline.restore-withdrawn": _restore_withdrawn,
    "pipeline.rescale-refused": _rescale_refused,
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


def sentence(
    kind: str, payload: Any, names: dict[int, str] | None = None, member: str | None = None
) -> str:
    """The sentence of one event; ``names`` label task groups by id ("reader 1 of pipeline
    2"), ``member`` is the name of the member the event was recorded with. A UUID in it
    (a member's, in a cause) is cut to its first 8 characters."""
    build = SENTENCES.get(kind)
    text = None
    if build is not None and isinstance(payload, dict):
        try:
            text = build(payload, Context(names or {}, member))
        except (KeyError, TypeError, ValueError):
            pass  # a payload without what the sentence needs: say what it has
    return _UUID.sub(r"\1", text if text is not None else generic(kind, payload))


def _member_name(event: EngineEvent) -> str | None:
    """The name of the member the event was recorded with, if it was read with it (never a
    query per event)."""
    if getattr(event, "member_id", None) is None or not EngineEvent.member.is_cached(event):
        return None
    return event.member.name if event.member else None


def _line(event: EngineEvent, names: dict[int, str] | None) -> Line:
    text = sentence(event.kind, event.payload, names, _member_name(event))
    return Line(event.kind, text, event.seq, event.at)


def lines(events: Iterable[EngineEvent], names: dict[int, str] | None = None) -> list[Line]:
    """The events (newest first, with ``kind``, ``payload``, ``seq``, ``at``) as lines, each
    run of failed checkpoints in a line per pipeline (a sink that is down fails every one)."""
    out: list[Line] = []
    run: list[EngineEvent] = []
    for event in events:
        if event.kind == _RUN_KIND and isinstance(event.payload, dict):
            run.append(event)
            continue
        out += _run_lines(run, names)
        run = []
        out.append(_line(event, names))
    return out + _run_lines(run, names)


def _run_lines(run: list[EngineEvent], names: dict[int, str] | None) -> list[Line]:
    """A run of failed checkpoints (newest first) as a line per pipeline, the newest reason
    given; a pipeline's lone failure as itself."""
    by_pipeline: dict[Any, list[EngineEvent]] = {}
    for event in run:
        by_pipeline.setdefault(event.payload.get("pipelineId"), []).append(event)
    out = []
    for pipeline, events in by_pipeline.items():
        if len(events) == 1:
            out.append(_line(events[0], names))
            continue
        ids = sorted(i for e in events if isinstance(i := e.payload.get("checkpointId"), int))
        span = f"{ids[0]}{DASH}{ids[-1]}" if ids else "?"
        reason = _because(events[0].payload, "reason")
        out.append(
            Line(
                _RUN_KIND,
                f"Checkpoints {span} of pipeline {pipeline} failed ({len(events)} in all)"
                f"{', the newest' if reason else ''}{reason}.",
                events[0].seq,
                events[0].at,
                first_seq=events[-1].seq,
                first_at=events[-1].at,
                count=len(events),
            )
        )
    return out
