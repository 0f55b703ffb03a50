"""Every event kind the engine records reads as a sentence on the job page
(dashboard.event_sentences), built by the kind's own builder (engine.events, engine.dirty.events,
engine.jobs.drain); an unknown kind or a payload short of what its sentence needs still reads as
a sentence, never a payload's repr. Statuses read as words, task groups by the member they run
on (never a slot's database id), UUIDs cut to 8 characters; runs of failed checkpoints are a
line per pipeline."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dashboard.event_sentences import LEFT_OUT, SENTENCES, generic, lines, sentence
from engine import events
from engine.dirty import events as dirty_events
from engine.jobs.drain import drain_event
from engine.jobs.rescale_step import refused_event
from engine.models import EngineEvent, Job, Member, MemberDrain
from engine.states import MemberState

ROOT = Path(__file__).resolve().parent.parent
MEMBER_UUID = uuid.UUID("00000000-0000-0000-0000-00000000000a")


def member(state: str = MemberState.ALIVE) -> Member:
    return Member(
        id=3,
        uuid=MEMBER_UUID,
        name="worker-2",
        address="10.0.0.2:5701",
        slot_mode="FIXED",
        slot_count=8,
        protocol_version=3,
        tags={},
        state=state,
    )


def drain() -> MemberDrain:
    return MemberDrain(
        request_id=uuid.UUID(int=7),
        requested_by_name="otto",
        reason="firmware",
        moved_task_groups=3,
    )


def on_member(event: EngineEvent) -> EngineEvent:
    """The event as the job page reads it: with the member it was recorded with."""
    event.member = member()
    return event


JOB = Job(id=5, name="orders <nightly>", status="CREATED", mode="BATCH", slots_needed=4)
ATTEMPT = "attempt-1"
#: (the event as its builder makes it, the sentence it reads as), one or more per kind.
CASES = [
    (
        events.job_submitted(JOB, 2),
        "Job “orders <nightly>” submitted (batch): 2 pipelines, 4 slots needed.",
    ),
    (events.job_status(5, "RUNNING", "FINISHED"), "Job went from running to finished."),
    (
        events.job_status(5, "FAILING", "FAILED", error_msg="sink refused"),
        "Job went from failing to failed: sink refused.",
    ),
    (
        events.pipeline_status(5, 1, "DEPLOYING", "RUNNING"),
        "Pipeline 1 went from deploying to running.",
    ),
    (
        on_member(
            events.taskgroup_status(5, 12, 1, "DEPLOYING", "RUNNING", member_id=3, slot_id=4)
        ),
        "Reader 0 of pipeline 1 (attempt 1) went from deploying to running on worker-2.",
    ),
    (
        events.taskgroup_status(5, 13, 0, "RUNNING", "FAILED", error="ValueError: x"),
        "Task group 13 (attempt 0) went from running to failed: ValueError: x.",
    ),
    (
        events.pipeline_restore_requested(5, 1, 2, 5.0),
        "Pipeline 1 will be restored in 5.0 s (restore 2).",
    ),
    (
        events.pipeline_restore(
            5,
            3,
            1,
            2,
            cause=f"member worker-2 ({MEMBER_UUID}) lost: no heartbeat\nTraceback (most recent)",
            slots=[3, 4],
            from_checkpoint=60,
        ),
        "Pipeline 1 restored from checkpoint 60 onto 2 slots (restore 2): member worker-2 "
        "(00000000) lost: no heartbeat.",
    ),
    (
        events.pipeline_restore(5, 3, 2, 1, cause="", slots=[], from_checkpoint=None),
        "Pipeline 2 restored from the start (restore 1).",
    ),
    (
        events.pipeline_restore_requested(5, 1, 2, 0.0, task_groups=[12]),
        "Reader 0 of pipeline 1 will be restored in 0.0 s (restore 2 of pipeline 1).",
    ),
    (
        events.pipeline_restore(
            5, 3, 1, 2, cause="lost", slots=[4], from_checkpoint=60, task_groups=[12]
        ),
        "Reader 0 of pipeline 1 restored from checkpoint 60 onto 1 slot (restore 2): lost.",
    ),
    (
        events.pipeline_restore_withdrawn(5, 1, 2, [12, 14], "the whole pipeline restores"),
        "The restore of reader 0 of pipeline 1, task group 14 (restore 2 of pipeline 1) was "
        "withdrawn: the whole pipeline restores.",
    ),
    (events.checkpoint_triggered(5, 3, 60, 1), "Checkpoint 60 of pipeline 1 triggered."),
    (events.checkpoint_ended(5, 3, 60, 1, "COMPLETED"), "Checkpoint 60 of pipeline 1 completed."),
    (
        events.checkpoint_ended(5, 3, 61, 2, "FAILED", "expired after 60 s"),
        "Checkpoint 61 of pipeline 2 failed: expired after 60 s.",
    ),
    (
        events.member_joined(member()),
        "Member worker-2 joined at 10.0.0.2:5701 with 8 slots (fixed).",
    ),
    (
        events.member_ended(member(MemberState.LEFT), "stopped", 9, 3),
        "Member worker-2 left: stopped.",
    ),
    (
        events.member_ended(member(MemberState.REMOVED), "no heartbeat", 9, 3, "UNPLANNED"),
        "Member worker-2 was removed (unplanned): no heartbeat.",
    ),
    (
        drain_event("member.drain-requested", drain(), member(), taskGroups=2),
        "otto asked to drain member worker-2: firmware.",
    ),
    (
        drain_event("member.drained", drain(), member(), state="LEFT", movedTaskGroups=3),
        "Drain of member worker-2 ended left, 3 task groups moved.",
    ),
    (
        drain_event(
            "member.drained",
            drain(),
            member(),
            state="EXPIRED",
            endReason="timed out",
            movedTaskGroups=1,
        ),
        "Drain of member worker-2 ended expired, 1 task group moved: timed out.",
    ),
    (
        events.master_elected(3, "master-1", 4242, "db-host"),
        "master-1 became the active master (pid 4242 on db-host).",
    ),
    (events.master_resigned(3, "master-1"), "master-1 resigned as the active master."),
    (
        events.job_history_failed(5, 3, "disk full"),
        "The finished-job record could not be written yet (it is retried): disk full.",
    ),
    (
        dirty_events.incident(
            5,
            3,
            member=member(),
            classification="UNPLANNED",
            episode_id=4,
            episode_started=True,
            sequence=9,
        ),
        "Member 00000000 (10.0.0.2:5701) was lost (unplanned): recovery episode 4 started.",
    ),
    (
        dirty_events.attempt_prepared(5, 3, ATTEMPT, 4, 1, 2),
        "Recovery attempt attempt-1 of pipeline 1 prepared (episode 4).",
    ),
    (
        dirty_events.attempt_confirmed(5, 3, ATTEMPT, 4, 2, True, 1),
        "Recovery attempt attempt-1 confirmed (episode 4, generation 2), counted: 1 recovery "
        "attempt so far.",
    ),
    (
        dirty_events.attempt_aborted(5, 3, ATTEMPT, 1, 2, "superseded"),
        "Recovery attempt attempt-1 of pipeline 1 aborted (restore 2): superseded.",
    ),
    (
        dirty_events.marked(5, 3, 3, 2, ATTEMPT),
        "Job marked dirty: 3 recovery attempts, over its threshold of 2.",
    ),
    (
        dirty_events.episode_ended(5, 3, 4, True, "all restored"),
        "Recovery episode 4 completed: the job runs again: all restored.",
    ),
    (
        dirty_events.episode_ended(5, 3, 4, False, "job failed"),
        "Recovery episode 4 aborted: job failed.",
    ),
    (
        dirty_events.tracking_incomplete(5, 3, "store timed out"),
        "Dirty-job tracking became incomplete: store timed out.",
    ),
    (
        dirty_events.tracker_failed([5], 3, "member loss", "deadlock")[0],
        "The dirty-job tracker failed in member loss: deadlock.",
    ),
    (dirty_events.repaired(5, 3, 2), "Dirty-job tracking repaired 2 gaps."),
    (
        refused_event(5, 1, {"restore": 2, "parallelism": 3}, "split s1 is held twice"),
        "The rescale of pipeline 1 to 3 readers was refused: split s1 is held twice.",
    ),
    (
        dirty_events.snapshot(
            5, 3, {"dirty": False, "evaluationStatus": "CLEAN", "recoveryAttemptCount": 0}
        ),
        "Dirty-job label kept in the job's history: CLEAN, 0 recovery attempts.",
    ),
    (
        dirty_events.acknowledged(
            5, by="oona", reason="checked", previous_reason=None, evaluation="UNKNOWN"
        ),
        "oona acknowledged the UNKNOWN dirty-job label: checked.",
    ),
]
NAMES = {12: "reader 0 of pipeline 1"}


@pytest.mark.parametrize(("event", "expected"), CASES, ids=[c[0].kind for c in CASES])
def test_each_kind_reads_as_its_sentence(event, expected):
    assert event.kind in SENTENCES
    (line,) = lines([event], NAMES)
    assert line.text == expected


def test_a_task_group_is_placed_by_its_members_name_never_by_a_slot_id():
    event = events.taskgroup_status(5, 12, 1, "DEPLOYING", "RUNNING", member_id=3, slot_id=4)
    # Read without its member (not fetched with it): no query, no slot id, no place.
    assert [line.text for line in lines([event], NAMES)] == [
        "Reader 0 of pipeline 1 (attempt 1) went from deploying to running."
    ]
    assert sentence(event.kind, event.payload, NAMES, member="worker-9").endswith(
        "to running on worker-9."
    )


def test_a_restores_cause_is_its_first_line_cut_short():
    cause = "psycopg.OperationalError: " + "connection refused " * 30 + "\nline two"
    event = events.pipeline_restore(
        5, 3, 2, 7, cause=cause, slots=list(range(40)), from_checkpoint=None
    )
    text = sentence(event.kind, event.payload)
    assert text.startswith("Pipeline 2 restored from the start onto 40 slots (restore 7): psycopg")
    assert text.endswith("….") and "line two" not in text and len(text) < 250


def recorded_kinds() -> set[str]:
    """Every kind the engine's sources append: ``kind="..."``, the kinds its builders choose
    between, the drain's, the dirty-job tracker's (``dirty.`` prefixed) and the checkpoint's
    ended states."""
    kinds: set[str] = set()
    kind = r'"([a-z]+\.[a-z-]+)"'
    for path in (ROOT / "engine").rglob("*.py"):
        text = path.read_text()
        kinds |= set(re.findall(rf"kind={kind}", text))
        kinds |= set(re.findall(rf"drain_event\(\s*{kind}", text))
        for pair in re.findall(rf"kind = {kind} if .* else {kind}", text):
            kinds |= set(pair)
    tracker = (ROOT / "engine" / "dirty" / "events.py").read_text()
    own = r'"([a-z-]+)"'
    named = re.findall(rf"_event\(\s*{own}", tracker)
    named += [k for pair in re.findall(rf"kind = {own} if .* else {own}", tracker) for k in pair]
    kinds |= {f"dirty.{k}" for k in named}
    assert 'kind=f"checkpoint.{state.lower()}"' in (ROOT / "engine" / "events.py").read_text()
    return kinds | {"checkpoint.completed", "checkpoint.failed"}


def test_every_kind_the_engine_records_has_its_sentence_and_a_case_here():
    recorded = recorded_kinds()
    assert len(recorded) >= 29
    assert recorded <= set(SENTENCES), recorded - set(SENTENCES)
    assert {c[0].kind for c in CASES} == set(SENTENCES)


def test_an_unknown_kind_or_a_short_payload_still_reads_as_a_sentence():
    assert generic("slot.moved", {"slotId": 4, "fromMember": "w-1", "tags": {"zone": "a"}}) == (
        "Slot moved: slot id 4; from member w-1; tags zone a."
    )
    assert sentence("slot.moved", {}) == "Slot moved."
    assert sentence("slot.moved", None) == "Slot moved."
    assert sentence("slot.moved", ["a", 1]) == "Slot moved: a, 1."
    # An older payload without what the sentence needs: its pairs, not a KeyError or a repr.
    assert sentence("checkpoint.completed", {"checkpointId": 3}) == (
        "Checkpoint completed: checkpoint id 3."
    )
    long = sentence("job.status", {"from": "RUNNING", "to": "FAILED", "errorMsg": "x" * 1000})
    assert len(long) < 400 and long.endswith("….")
    for event, _ in CASES:
        text = sentence(event.kind, event.payload)
        assert "{" not in text and "': " not in text


def at(second: int) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second)


def stored(seq: int, event: EngineEvent) -> EngineEvent:
    event.seq, event.at = seq, at(seq)
    return event


def test_runs_of_failed_checkpoints_collapse_to_a_line_per_pipeline():
    newest_first = [
        stored(9, events.job_status(5, "RUNNING", "CANCELING")),
        stored(8, events.checkpoint_ended(5, 3, 63, 1, "FAILED", "expired after 60 s")),
        stored(7, events.checkpoint_ended(5, 3, 62, 2, "FAILED", "sink down")),
        stored(6, events.checkpoint_ended(5, 3, 61, 1, "FAILED", "expired")),
        stored(5, events.checkpoint_ended(5, 3, 60, 1, "FAILED")),
        stored(4, events.pipeline_restore_requested(5, 1, 1, 3.0)),
        stored(3, events.checkpoint_ended(5, 3, 59, 1, "FAILED", "expired")),
    ]
    shown = lines(newest_first)
    assert [(line.text, line.seq, line.first_seq, line.count) for line in shown] == [
        ("Job went from running to canceling.", 9, None, 1),
        (
            "Checkpoints 60\N{EN DASH}63 of pipeline 1 failed (3 in all), the newest: expired "
            "after 60 s.",
            8,
            5,
            3,
        ),
        ("Checkpoint 62 of pipeline 2 failed: sink down.", 7, None, 1),
        ("Pipeline 1 will be restored in 3.0 s (restore 1).", 4, None, 1),
        ("Checkpoint 59 of pipeline 1 failed: expired.", 3, None, 1),
    ]
    assert shown[1].at == at(8) and shown[1].first_at == at(5)
    assert shown[1].kind == "checkpoint.failed"


def test_the_list_leaves_out_triggered_and_completed_checkpoints():
    assert set(LEFT_OUT) == {"checkpoint.triggered", "checkpoint.completed"}
    assert "checkpoint.failed" not in LEFT_OUT
