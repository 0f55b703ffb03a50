"""The job page's sections, server-rendered, and their test hooks (a contract): the graph
(``[data-job-graph]``, one ``[data-node]`` per plugin with its status class), the checkpoints
(``[data-checkpoints]``, ``[data-checkpoint-id]`` rows), the exceptions (``[data-exceptions]``,
``[data-exception-id]`` with ``data-member``, ``data-attempt``, ``data-caused-restore``), the
logs (``[data-logs]``, ``[data-log-line]`` with ``data-level``, filtered by ``?logLevel=`` and
``?logTaskGroup=`` which the live socket keeps) and the events as sentences. One render stays a
bounded number of queries, however many rows each section has."""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)

#: Two pipelines (a source each), four task groups; the second sink reads both streams, so its
#: copies' paths carry the streams' names, one of them markup.
CONFIG = """
env { job.name = "sections <i>", job.mode = STREAMING, parallelism = 1 }
source {
  FakeSource { plugin_output = "a", rows.per-second = 5 }
  FakeSource { plugin_output = "<b>x</b>", rows.per-second = 5 }
}
sink {
  Console { plugin_input = "a" }
  Blackhole { plugin_input = ["a", "<b>x</b>"] }
}
"""
PLUGINS = {
    "source[0].FakeSource",
    "source[1].FakeSource",
    "sink[0].Console",
    "sink[1].Blackhole@a",
    "sink[1].Blackhole@<b>x</b>",
}


@pytest.fixture
def running(engine):
    """A running job of two pipelines with 100 checkpoints (acked by both readers), 16
    exceptions and 200 log lines."""
    from engine.jobs import checkpoint_history
    from engine.models import (
        Checkpoint,
        JobException,
        Member,
        Pipeline,
        TaskCheckpoint,
        TaskGroup,
        TaskLogLine,
    )

    engine.add_member(slots=8)
    job = engine.submit(config=CONFIG)
    engine.schedule()
    engine.run_deployed()
    pipelines = {p.index: p for p in Pipeline.objects.filter(job=job)}
    readers = {g.pipeline.index: g for g in TaskGroup.objects.filter(job=job, kind="READER")}
    now = timezone.now()
    checkpoints = Checkpoint.objects.bulk_create(
        Checkpoint(
            job=job,
            pipeline=pipelines[1 + n % 2],
            state="FAILED" if n == 99 else "COMPLETED",
            triggered_at=now - timedelta(seconds=200 - n),
            ended_at=now - timedelta(seconds=200 - n) + timedelta(milliseconds=250),
            failure_reason="tolerable <failure>" if n == 99 else "",
        )
        for n in range(100)
    )
    TaskCheckpoint.objects.bulk_create(
        TaskCheckpoint(
            checkpoint=c,
            task_group=readers[c.pipeline.index],
            attempt=0,
            state={"offset": c.id},
            acked_at=c.triggered_at + timedelta(milliseconds=120),
            size_bytes=1536,
        )
        for c in checkpoints
    )
    checkpoint_history.record(checkpoints)  # as the master records them when they end
    member = Member.objects.first()
    JobException.objects.bulk_create(
        JobException(
            job=job,
            task_group_id=readers[1].id,
            task_group_label=f"reader {readers[1].index}",
            pipeline_index=1,
            attempt=n,
            member=member,
            member_name=member.name,
            error=f"boom {n} <img src=x>",
            traceback=f'Traceback (most recent call last):\n  File "x.py"\nValueError: {n}',
            member_lost=n % 2 == 1,
            caused_restore=n < 15,
        )
        for n in range(16)
    )
    levels = [logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG]
    TaskLogLine.objects.bulk_create(
        TaskLogLine(
            job=job,
            task_group_id=readers[1 + n % 2].id,
            attempt=0,
            at=now,
            level=levels[n % 4],
            logger="keel.console",
            message=f"line {n} <script>alert(1)</script>",
        )
        for n in range(200)
    )
    return job, readers


def page(client, job, query: str = "") -> str:
    response = client.get(f"/jobs/{job.id}/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_the_graph_draws_each_plugin_once_with_its_status_and_the_task_groups(running, client):
    job, readers = running
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    graph = re.search(r"<div class=\"job-graph\" data-job-graph>(.*?)</div>", html, re.S).group(1)
    nodes = re.findall(r'<g class="node (\w+) (\w+)" data-node="([^"]*)"', graph)
    paths = {path.replace("&lt;", "<").replace("&gt;", ">") for _, _, path in nodes}
    assert paths == PLUGINS and len(nodes) == len(PLUGINS)
    assert {status for _, status, _ in nodes} == {"running"}
    assert "<b>x</b>" not in graph and "&lt;b&gt;x&lt;/b&gt;" in graph  # escaped
    assert graph.count('<path class="edge') == 3  # source[0] to two sinks, source[1] to one
    for reader in readers.values():
        assert f'data-graph-task-group="{reader.id}"' in graph
    assert graph.count("data-graph-task-group=") == 4  # and the two enumerators


def test_checkpoints_show_the_newest_hundred_with_their_acks_sizes_and_failure(running, client):
    from engine.models import Checkpoint

    job, readers = running
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    table = re.search(r"<table class=\"checkpoints\" data-checkpoints>(.*?)</table>", html, re.S)
    rows = re.findall(
        r'<tr data-checkpoint-id="(\d+)" data-state="(\w+)">(.*?)</tr>', table[1], re.S
    )
    ids = list(Checkpoint.objects.filter(job=job).order_by("-id").values_list("id", flat=True))
    assert [int(r[0]) for r in rows] == ids and len(rows) == 100
    newest = rows[0][2]
    assert rows[0][1] == "FAILED" and "tolerable &lt;failure&gt;" in newest
    assert "250 ms" in newest and "1.5\xa0KB" in newest  # its duration, its one ack's size
    assert f'data-ack-task-group="{readers[2].id}"' in newest
    assert "reader 0 of pipeline 2" in newest and "(+120 ms)" in newest
    assert 'data-keep-open="checkpoint-' in newest


def test_exceptions_show_the_newest_sixteen_with_member_attempt_and_restore(running, client):
    job, readers = running
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    section = re.search(r'<ol class="exceptions" data-exceptions>(.*?)</ol>', html, re.S)[1]
    entries = re.findall(
        r'<li data-exception-id="(\d+)" data-member="([^"]*)" data-attempt="(\d+)" '
        r'data-caused-restore="(yes|no)">(.*?)</li>',
        section,
        re.S,
    )
    assert len(entries) == 16
    assert [int(e[2]) for e in entries] == list(range(15, -1, -1))  # newest first
    assert entries[0][3] == "no" and {e[3] for e in entries[1:]} == {"yes"}
    assert {e[1] for e in entries} == {readers[1].member.name}
    text = entries[0][4]
    assert "boom 15 &lt;img src=x&gt;" in text and "<img" not in text
    assert "<details" in text and "ValueError: 15" in text and "(member lost)" in text
    assert "reader 0</strong> of pipeline 1" in text


def test_logs_show_the_newest_lines_and_filter_by_level_and_task_group(running, client):
    job, readers = running
    client.force_login(role_user("vera", "viewer"))

    def lines(query: str = "") -> list[tuple[str, str, str]]:
        html = page(client, job, query)
        box = re.search(r'<div class="log-lines" data-logs[^>]*>(.*?)</div>\s*<details', html, re.S)
        found = re.findall(
            r'data-log-line="(\d+)" data-level="(\w+)" data-task-group="(\d+)">(.*?)</div>',
            box[1],
            re.S,
        )
        for *_, text in found:
            assert "<script>" not in text and "&lt;script&gt;" in text
        return [(line, level, group) for line, level, group, _ in found]

    every = lines()
    assert len(every) == 200 and int(every[0][0]) < int(every[-1][0])  # oldest first
    assert {level for _, level, _ in every} == {"DEBUG", "INFO", "WARNING", "ERROR"}
    warned = lines("?logLevel=WARNING")
    assert warned and {level for _, level, _ in warned} == {"WARNING", "ERROR"}
    second = lines(f"?logTaskGroup={readers[2].id}&logLevel=warning")  # its DEBUG lines go
    assert len(second) == 50 and {(lv, int(g)) for _, lv, g in second} == {
        ("WARNING", readers[2].id)
    }
    # The filters are kept by the form, the polling and the socket.
    html = page(client, job, f"?logTaskGroup={readers[2].id}&logLevel=ERROR")
    query = f"logLevel=ERROR&amp;logTaskGroup={readers[2].id}"
    assert "&after=" in html and f'&{query}"' in html
    assert f'hx-get="/jobs/{job.id}/?{query}"' in html
    assert f'<option value="{readers[2].id}" selected>' in html
    assert "<option selected>ERROR</option>" in html
    # Unknown values filter nothing (a page never refuses its URL).
    assert len(lines("?logLevel=LOUD&logTaskGroup=999999999")) == 200


def test_the_live_render_keeps_the_log_filters(running):
    from dashboard import live

    job, _ = running
    user = role_user("vera", "viewer")
    html = live.fragments(f"job.{job.id}", {"logLevel": "ERROR"}, user, 7)
    levels = set(re.findall(r'data-log-line="\d+" data-level="(\w+)"', html))
    assert levels == {"ERROR"}
    assert html.startswith('<div id="job" hx-swap-oob="innerHTML">')


def test_events_keep_a_failure_and_its_restore_under_many_checkpoints(running, client):
    """Triggered and completed checkpoints are left out of the list (the query's, so hundreds
    of them do not push a failure and its restore out of the newest read); failed ones stay,
    a run of them one line; a task group is placed by its member's name."""
    from django.db import transaction

    from dashboard import job_sections
    from engine import events
    from engine.models import Member

    job, readers = running
    member = Member.objects.get(id=readers[1].member_id)
    with transaction.atomic():
        events.append_events(
            [
                events.taskgroup_status(
                    job.id, readers[1].id, 0, "RUNNING", "FAILED", member_id=member.id, error="x"
                ),
                events.pipeline_restore_requested(job.id, 1, 1, 3.0),
                events.pipeline_restore(
                    job.id,
                    1,
                    1,
                    1,
                    cause=f"member {member.name} ({member.uuid}) lost: no heartbeat",
                    slots=[7, 8],
                    from_checkpoint=4,
                ),
                *(events.checkpoint_ended(job.id, 1, n, 2, "FAILED", "expired") for n in (5, 6)),
                *(
                    event
                    for n in range(1, 2 * job_sections.EVENTS_READ)
                    for event in (
                        events.checkpoint_triggered(job.id, 1, n, 1),
                        events.checkpoint_ended(job.id, 1, n, 1, "COMPLETED"),
                    )
                ),
            ]
        )
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    table = re.search(r'<table class="events" data-events>(.*?)</table>', html, re.S)[1]
    assert "checkpoint.completed" not in table and "checkpoint.triggered" not in table
    assert (
        f"Reader 0 of pipeline 1 (attempt 0) went from running to failed on {member.name}: x."
        in table
    )
    assert "Pipeline 1 will be restored in 3.0 s (restore 1)." in table
    assert (
        f"Pipeline 1 restored from checkpoint 4 onto 2 slots (restore 1): member {member.name} "
        f"({str(member.uuid)[:8]}) lost: no heartbeat." in table
    )
    assert str(member.uuid) not in table and "slot 7" not in table
    assert (
        "Checkpoints 5\N{EN DASH}6 of pipeline 2 failed (2 in all), the newest: expired." in table
    )
    assert re.search(r'data-event-count="2"', table)
    assert "Pipeline 1 went from" in table and "{" not in table  # no payload reprs


def test_the_summary_says_restores_who_when_the_last_checkpoint_and_the_workers(running, client):
    """The dirty-job label is called so (DISABLED is not "will not recover"), beside the
    restores and the last one's time, who submitted the job, its times, its newest completed
    checkpoint's age and the workers it runs on."""
    from django.db import transaction

    from engine import events
    from engine.models import Job, Pipeline

    job, readers = running
    Job.objects.filter(id=job.id).update(submitted_by=role_user("sam", "operator"))
    Pipeline.objects.filter(job=job, index=1).update(restore_count=2)
    with transaction.atomic():
        events.append_events(
            events.pipeline_restore(job.id, 1, 1, n, cause="", slots=[], from_checkpoint=None)
            for n in (1, 2)
        )
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    summary = re.search(r'<dl class="summary">(.*?)</dl>', html, re.S)[1]
    fields = dict(re.findall(r'<dd data-field="(\w+)">(.*?)</dd>', summary, re.S))
    assert "<dt>Recovery</dt>" not in summary and "Dirty-job label</dt>" in summary
    assert "DISABLED" in fields["dirtyLabel"] and "still restores" in fields["dirtyLabel"]
    assert re.fullmatch(r"2, the last <time [^>]+>\d+ s ago</time>", fields["restores"])
    assert re.fullmatch(r"completed <time [^>]+>10[1-9] s ago</time>", fields["lastCheckpoint"])
    assert fields["submittedBy"] == "sam"
    assert fields["workers"] == ", ".join(sorted({r.member.name for r in readers.values()}))
    assert "<time datetime=" in fields["createdAt"] and "<time datetime=" in fields["startedAt"]
    assert "finishedAt" not in fields  # it runs


def test_a_lane_b_reader_shows_its_back_pressure(running, client):
    from engine.models import TaskGroup

    job, readers = running
    TaskGroup.objects.filter(id=readers[1].id).update(busy_seconds=10.0, blocked_seconds=6.5)
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    shown = re.search(
        rf'data-task-group-id="{readers[1].id}">.*?<div class="back-pressure (\w+)" '
        r'data-back-pressure="([\d.]+)"[^>]*>(.*?)</div>',
        html,
        re.S,
    )
    assert shown and shown[1] == "high" and float(shown[2]) == 0.65
    assert "65%" in shown[3] and "6.5 s blocked" in shown[3]


def test_a_finished_job_draws_its_graph_from_its_history(running, client):
    """Once its running state is cleaned up, the graph comes from the summary its history
    kept (plugins, edges and the task groups as they ended)."""
    from engine.jobs import summary
    from engine.models import Pipeline
    from history.models import JobHistory

    job, _ = running
    snapshot = summary.snapshot(job)
    for pipeline in snapshot["pipelines"]:
        pipeline["status"] = "CANCELED"
    JobHistory.objects.create(job=job, status="CANCELED", summary=snapshot)
    Pipeline.objects.filter(job=job).delete()
    job.status = "CANCELED"
    job.save(update_fields=["status"])
    client.force_login(role_user("vera", "viewer"))
    html = page(client, job)
    nodes = re.findall(r'<g class="node \w+ (\w+)" data-node="([^"]*)"', html)
    assert len(nodes) == len(PLUGINS) and {status for status, _ in nodes} == {"canceled"}
    assert html.count("data-graph-task-group=") == 4


def test_one_render_of_the_page_is_a_bounded_number_of_queries(
    running, client, django_assert_max_num_queries
):
    """Every open tab renders the page again on each event of its job: a fixed number of
    queries (20 with the session's four), whatever the rows of its sections."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard import live
    from engine.models import Checkpoint, TaskLogLine

    job, _ = running
    client.force_login(role_user("vera", "viewer"))
    page(client, job)
    with django_assert_max_num_queries(20):
        page(client, job)
    user = role_user("otto", "operator")
    user.has_perm("engine.view_job")  # its permissions cached, as a socket's user's are

    def render() -> int:
        with CaptureQueriesContext(connection) as queries:
            live.fragments(f"job.{job.id}", {"logLevel": "INFO"}, user, 1)
        return len(queries)

    before = render()
    assert before <= 15
    newest = Checkpoint.objects.filter(job=job).order_by("-id").first()
    Checkpoint.objects.bulk_create(
        Checkpoint(job=job, pipeline_id=newest.pipeline_id, state="PENDING") for _ in range(50)
    )
    line = TaskLogLine.objects.filter(job=job).values().first()
    del line["id"]
    TaskLogLine.objects.bulk_create(TaskLogLine(**line) for _ in range(100))
    assert render() == before
