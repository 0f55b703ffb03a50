"""The dashboard's pages and their test hooks (a contract): ``/jobs/`` rows are
``<tr data-job-id>`` with ``[data-field=jobStatus]`` and ``[data-field=evaluationStatus]``;
cluster member rows are ``[data-member-uuid]`` with ``[data-field=state]``. Filters live in
the URL, and every page carries its live socket and the seq it shows."""

from __future__ import annotations

import re

import pytest

from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = 'env {{ job.name = "{name}" }}\nsource {{ FakeSource {{ }} }}\nsink {{ Blackhole {{ }} }}'


def rows(html: str) -> dict[int, tuple[str, str]]:
    found = {}
    for match in re.finditer(r'<tr data-job-id="(\d+)">(.*?)</tr>', html, re.S):
        status = re.search(r'data-field="jobStatus">(\w+)<', match.group(2)).group(1)
        health = re.search(r'data-field="evaluationStatus">(\w+)<', match.group(2)).group(1)
        found[int(match.group(1))] = (status, health)
    return found


def test_the_jobs_page_filters_searches_and_counts(engine, client):
    engine.add_member(slots=8)
    tracked = engine.submit(
        config=CONFIG.format(name="nightly-orders").replace(
            "env {", "env { job.dirty-task.threshold = 2,"
        )
    )
    plain = engine.submit(config=CONFIG.format(name="hourly-clicks"))
    engine.schedule()
    engine.cancel(plain)
    client.force_login(role_user("vera", "viewer"))

    page = client.get("/jobs/").content.decode()
    assert rows(page) == {tracked.id: ("SCHEDULED", "CLEAN"), plain.id: ("CANCELED", "DISABLED")}
    assert 'data-count="CLEAN">CLEAN 1<' in page and 'data-count="DIRTY">DIRTY 0<' in page
    assert re.search(r'ws-connect="/ws/live/\?topic=jobs&after=\d+"', page)
    assert list(rows(client.get("/jobs/?jobStatus=CANCELED").content.decode())) == [plain.id]
    assert list(rows(client.get("/jobs/?evaluationStatus=CLEAN").content.decode())) == [tracked.id]
    assert list(rows(client.get("/jobs/?q=nightly").content.decode())) == [tracked.id]
    assert list(rows(client.get(f"/jobs/?q={plain.id}").content.decode())) == [plain.id]
    empty = client.get("/jobs/?evaluationStatus=DIRTY").content.decode()
    assert rows(empty) == {} and "No job matches these filters" in empty
    # The polling fallback gets the same rows as an out-of-band swap.
    partial = client.get("/jobs/?jobStatus=CANCELED", HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="jobs-live" hx-swap-oob="true">') and "<html" not in partial


def test_pages_end_in_a_slash_and_the_old_paths_redirect_keeping_the_method(engine, client):
    engine.add_member(slots=8)
    job = engine.submit(config=CONFIG.format(name="slashed"))
    client.force_login(role_user("oona", "operator"))
    assert client.get(f"/jobs/{job.id}/").status_code == 200
    old = client.get(f"/jobs/{job.id}?from=mail")
    assert (old.status_code, old["Location"]) == (308, f"/jobs/{job.id}/?from=mail")
    old = client.post(f"/jobs/{job.id}/cancel")
    assert (old.status_code, old["Location"]) == (308, f"/jobs/{job.id}/cancel/")
    # A form posted to the old path still acts (308: the client posts it again).
    assert client.post(f"/jobs/{job.id}/cancel", follow=True).status_code == 200
    from engine.models import Job

    assert Job.objects.get(id=job.id).status == "CANCELED"
    member = engine.add_member(slots=2)
    old = client.post(f"/members/{member.uuid}/drain", {"reason": "x"})
    assert (old.status_code, old["Location"]) == (308, f"/members/{member.uuid}/drain/")
    # The jobs page's socket keeps the page and the search, URL-encoded.
    page = client.get("/jobs/?q=a%26b c&page=2").content.decode()
    assert re.search(r'ws-connect="/ws/live/\?topic=jobs&after=\d+&q=a%26b\+c&amp;page=2"', page)


def test_the_cluster_page_marks_members_and_the_job_page_reads_live_or_from_history(engine, client):
    member = engine.add_member(slots=2)
    job = engine.submit(config=CONFIG.format(name="one"))
    client.force_login(role_user("vera", "viewer"))
    page = client.get("/").content.decode()
    assert re.search(rf'data-member-uuid="{member.uuid}">.*?data-field="state">ALIVE<', page, re.S)
    detail = client.get(f"/jobs/{job.id}/").content.decode()
    assert f'ws-connect="/ws/live/?topic=job.{job.id}&after=' in detail
    assert "job.submitted" in detail  # the job's events


def test_submit_shows_errors_at_their_line_and_only_operators_submit_or_cancel(engine, client):
    engine.add_member(slots=8)
    client.force_login(role_user("otto", "operator"))
    bad = "env {\n  parallelism = 0\n}\nsource { FakeSource { } }\nsink { Console { } }\n"
    response = client.post("/submit/", {"config": bad})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'data-error-path="env.parallelism"' in page
    assert '<li class="bad" data-line="' in page
    assert "parallelism = 0" in page  # the text is kept to fix
    syntax = client.post("/submit/", {"config": "env {\n  a = [1, 2 }\n" + bad[25:]})
    assert 'data-error-line="2"' in syntax.content.decode()
    response = client.post("/submit/", {"config": CONFIG.format(name="from-the-page")})
    assert response.status_code == 302
    job_id = int(response["Location"].rstrip("/").split("/")[-1])
    detail = client.get(f"/jobs/{job_id}/").content.decode()
    assert 'data-action="cancel"' in detail
    assert client.get("/submit/?example=fake_to_console.streaming.conf").status_code == 200

    client.force_login(role_user("vera", "viewer"))
    assert 'data-action="cancel"' not in client.get(f"/jobs/{job_id}/").content.decode()
    assert client.post(f"/jobs/{job_id}/cancel/").status_code == 403
    assert client.post("/submit/", {"config": CONFIG.format(name="x")}).status_code == 403

    client.force_login(role_user("oona", "operator"))
    assert client.post(f"/jobs/{job_id}/cancel/").status_code == 302
    from engine.models import Job

    job = Job.objects.get(id=job_id)
    assert job.status == "CANCELED" and job.canceled_by.username == "oona"


def test_running_jobs_are_sampled_for_the_sparkline_and_old_samples_go(engine, client):
    from datetime import timedelta

    from django.utils import timezone

    from engine.jobs import lifecycle, throughput
    from engine.models import TaskGroup, ThroughputSample

    engine.add_member(slots=4)
    job = engine.submit(config=CONFIG.format(name="sampled"))
    engine.schedule()
    engine.run_deployed()
    for rate in (10.0, 30.0):
        for group in TaskGroup.objects.filter(job=job):
            lifecycle.report_metrics(group.id, group.attempt, group.member_id, 1, 1, rate)
        throughput.sample(engine.epoch)
    assert throughput.recent(job.id) == [20.0, 60.0]  # two task groups, summed
    client.force_login(role_user("vera", "viewer"))
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert '<svg class="sparkline"' in page and 'data-field="rowsPerSecond">60.0<' in page
    ThroughputSample.objects.update(at=timezone.now() - timedelta(hours=1))
    throughput.sample(engine.epoch)
    assert throughput.recent(job.id) == [60.0]  # the old ones are gone


def test_operators_drain_a_member_from_the_cluster_page_after_confirming(engine, client):
    from django.test import Client

    from engine.models import MemberDrain

    member = engine.add_member(slots=2)
    engine.add_member(slots=2)
    client.force_login(role_user("vera", "viewer"))
    page = client.get("/").content.decode()
    assert 'data-action="drain"' not in page and "drain-dialog" not in page
    assert client.post(f"/members/{member.uuid}/drain/", {"reason": "x"}).status_code == 403

    operator = Client(enforce_csrf_checks=True)
    operator.force_login(role_user("otto", "operator"))
    page = operator.get("/").content.decode()
    assert f'data-drain-url="/members/{member.uuid}/drain/"' in page
    assert '<dialog id="drain-dialog"' in page and 'name="reason" required' in page
    # The form needs its CSRF token, like every form.
    assert operator.post(f"/members/{member.uuid}/drain/", {"reason": "x"}).status_code == 403
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = operator.post(
        f"/members/{member.uuid}/drain/",
        {"reason": "firmware update", "csrfmiddlewaretoken": token},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f"draining {member.name}" in page
    assert re.search(
        rf'data-member-uuid="{member.uuid}">.*?data-field="drain"[^>]*>DRAINING<', page, re.S
    )
    drain = MemberDrain.objects.get(member=member)
    assert (drain.requested_by_name, drain.reason) == ("otto", "firmware update")


def test_the_job_page_shows_the_source_lane_and_lane_a_runtime_metrics(engine, client, settings):
    from engine.jobs import lifecycle
    from engine.models import TaskGroup

    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": ["FakeSource"]}
    engine.add_member(slots=4)
    job = engine.submit(config=CONFIG.format(name="managed"))
    engine.schedule()
    engine.run_deployed()
    reader = TaskGroup.objects.get(job=job, kind="READER")
    metrics = {
        "mailbox": {"commands": 3, "bytes": 2048, "reservedInUse": 1, "oldestAgeMs": 7},
        "admissions": {"ACCEPTED": 12, "RETRY_LATER": 2},
        "assignments": {"APPLIED": 4, "DISPATCHED": 0},
    }
    lifecycle.report_metrics(reader.id, reader.attempt, reader.member_id, 1, 1, 1.0, metrics)
    client.force_login(role_user("vera", "viewer"))
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert 'data-source-lane="A"' in page
    runtime = re.search(
        r"<div class=\"source-runtime\" data-source-runtime>(.*?)</div>", page, re.S
    )
    text = " ".join(runtime.group(1).split())
    assert "mailbox 3 command(s), 2.0 KB, 1 reserved, oldest 7 ms" in text
    assert "admissions ACCEPTED 12 RETRY_LATER 2" in text
    assert "assignments APPLIED 4" in text and "DISPATCHED" not in text
    detail = client.get(f"/api/v1/jobs/{job.id}").json()
    groups = {g["kind"]: g for g in detail["pipelines"][0]["taskGroups"]}
    assert groups["READER"]["sourceRuntime"] == metrics
    assert groups["ENUMERATOR"]["sourceRuntime"] is None  # never reported


def test_the_job_page_shows_an_acknowledged_unknown_label_as_acknowledged(engine, client):
    """An operator acknowledges a job whose tracking reads UNKNOWN: its page still says
    UNKNOWN, marked acknowledged with who and why, and the CLEAN filter does not list it."""
    from django.urls import reverse

    from engine.dirty.tracking import record_gap

    engine.add_member(slots=8)
    job = engine.submit(
        config=CONFIG.format(name="audited").replace("env {", "env { job.dirty-task.threshold = 2,")
    )
    record_gap(job.id, "tracker store timed out")
    client.force_login(role_user("oona", "operator"))
    page = client.get(reverse("job", args=[job.id])).content.decode()
    assert 'class="badge dirty-unknown">UNKNOWN</span>' in page
    assert 'data-field="acknowledged"' not in page

    acked = client.post(
        f"/api/v1/jobs/{job.id}/dirty/ack",
        {"reason": "restores checked by hand"},
        content_type="application/json",
    )
    assert acked.status_code == 200, acked.content
    page = client.get(reverse("job", args=[job.id])).content.decode()
    assert 'class="badge dirty-unknown">UNKNOWN</span>' in page
    assert re.search(r'data-field="acknowledged"[^>]*>acknowledged<', page)
    by = re.search(r'data-field="acknowledgedBy">(.*?)</dd>', page, re.S).group(1)
    assert by.startswith("by oona at ") and by.endswith(": restores checked by hand")
    assert "incomplete: tracker store timed out" in page
    assert job.id not in rows(client.get("/jobs/?evaluationStatus=CLEAN").content.decode())
    assert rows(client.get("/jobs/?evaluationStatus=UNKNOWN").content.decode())[job.id][1] == (
        "UNKNOWN"
    )
