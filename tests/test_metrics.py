"""``GET /metrics``: Prometheus text that prometheus_client's own parser reads, counters that
move with what they count and never go back when rows are cleaned up or attempts start over,
bounded labels, and scrape access by loopback, bearer token or a viewer's API token (the live
cluster's counters moving as a worker is killed: tests/test_drain_cluster.py)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from engine.jobs import cleanup
from engine.models import JobCleanupRecord, TaskGroup
from tests.conftest import role_user
from tests.dirtykit import host_of_both_pipelines, running_job

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_counters_move_with_a_member_loss_and_survive_cleanup(engine, client):
    job, _ = running_job(engine, members=4, threshold=1)
    TaskGroup.objects.filter(job=job, kind="READER").update(source_received=500, sink_written=400)
    before = scrape(client)
    assert value(before, "keel_jobs", status="RUNNING") == 1
    assert value(before, "keel_member_events_total") == 0
    assert value(before, "keel_job_evaluation", job_id=str(job.id), evaluation="CLEAN") == 1
    assert value(before, "keel_rows_read_total") == 1000

    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    after = scrape(client)
    assert value(after, "keel_member_events_total") == 1
    assert value(after, "keel_restores_total", cause="member_loss") == 2  # two pipelines
    assert value(after, "keel_recovery_attempts_total") == 1
    assert value(after, "keel_dirty_transitions_total") == 1
    assert value(after, "keel_dirty_jobs", evaluation="DIRTY") == 1
    assert value(after, "keel_members", state="REMOVED") == 1
    # The restarted attempts start their counts over; the counter does not go back.
    assert value(after, "keel_rows_read_total") == 1000

    engine.cancel(job)
    record = JobCleanupRecord.objects.get(job_id=job.id, kind="JOB_STATE")
    JobCleanupRecord.objects.filter(id=record.id).update(due_at=record.created_at)
    assert cleanup.execute(record.id) == "done"
    assert not TaskGroup.objects.filter(job=job).exists()
    cleaned = scrape(client)
    assert value(cleaned, "keel_rows_read_total") == 1000
    assert value(cleaned, "keel_restores_total", cause="member_loss") == 2
    assert value(cleaned, "keel_cleanup_records", kind="JOB_STATE", state="DONE") == 1
    # Job ids appear only for running jobs (bounded by the slots), never names.
    assert not any(labels and "job_id" in dict(labels) for _, labels in cleaned)
    assert not any("job_name" in dict(labels) for _, labels in cleaned)


def test_checkpoint_durations_fill_the_histogram(engine, client):
    from engine import counters

    with transaction.atomic():
        counters.checkpoint_ended(True, 0.3)
        counters.checkpoint_ended(True, 7.0)
        counters.checkpoint_ended(False, None)
    samples = scrape(client)
    assert value(samples, "keel_checkpoints_total", result="completed") == 2
    assert value(samples, "keel_checkpoints_total", result="failed") == 1
    assert value(samples, "keel_checkpoint_duration_seconds_bucket", le="0.25") == 0
    assert value(samples, "keel_checkpoint_duration_seconds_bucket", le="0.5") == 1
    assert value(samples, "keel_checkpoint_duration_seconds_bucket", le="10.0") == 2
    assert value(samples, "keel_checkpoint_duration_seconds_bucket", le="+Inf") == 2
    assert value(samples, "keel_checkpoint_duration_seconds_count") == 2
    assert value(samples, "keel_checkpoint_duration_seconds_sum") == pytest.approx(7.3)


def test_scrapers_need_loopback_a_bearer_token_or_a_viewers_token(client):
    engine_options = settings.ENGINE
    remote = {"REMOTE_ADDR": "203.0.113.9"}
    with override_settings(
        ENGINE={**engine_options, "metrics.loopback": False, "metrics.token": "s3cret-scrape"}
    ):
        assert client.get("/metrics", **remote).status_code == 401
        assert client.get("/metrics").status_code == 401  # loopback turned off
        wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **remote)
        assert wrong.status_code == 401
        scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-scrape", **remote)
        viewer = Token.objects.create(user=role_user("vera", "viewer"))
        scrape(client, HTTP_AUTHORIZATION=f"Token {viewer.key}", **remote)
        nobody = Token.objects.create(user=role_user_without_role("nina"))
        refused = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {nobody.key}", **remote)
        assert refused.status_code == 401
    with override_settings(ENGINE={**engine_options, "metrics.loopback": True}):
        scrape(client)  # the test client calls from 127.0.0.1
        assert client.get("/metrics", **remote).status_code == 401


def role_user_without_role(username: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username, password="x-Very-long-pass-0")


def test_the_prometheus_examples_name_only_metrics_keel_exposes(engine, client):
    """docker/prometheus: the scrape config targets /metrics and every alert expression reads
    series this exposition has (a renamed metric would silently never alert)."""
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent / "docker" / "prometheus"
    config = yaml.safe_load((root / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["metrics_path"] == "/metrics"
    rules = [
        r for g in yaml.safe_load((root / "alerts.yml").read_text())["groups"] for r in g["rules"]
    ]
    text = client.get("/metrics").content.decode()
    exposed = {name for name, _ in scrape(client)} | set(re.findall(r"^# TYPE (\w+)", text, re.M))
    job = config["scrape_configs"][0]["job_name"]
    for rule in rules:
        names = series_read_by(rule["expr"])
        assert names, f"{rule['alert']} reads no series"
        for name in names:
            assert name in exposed | {"up"}, f"{rule['alert']} reads {name}, which /metrics lacks"
        for selected in re.findall(r'\bjob="([^"]*)"', rule["expr"]):
            assert selected == job, f"{rule['alert']} selects job {selected}, scraped as {job}"
    assert {
        "KeelJobDirty",
        "KeelJobRecoveryUnknown",
        "KeelWebDown",
        "KeelTargetMissing",
        "KeelDatabaseDown",
        "KeelJobsFailing",
    } <= {r["alert"] for r in rules}
    by_name = {r["alert"]: r for r in rules}
    assert by_name["KeelWebDown"]["expr"] == f'up{{job="{job}"}} == 0'
    assert by_name["KeelWebDown"]["for"] == "1m"
    assert "keel_jobs_ended_total" in by_name["KeelJobsFailing"]["expr"]
    unknown = next(r for r in rules if r["alert"] == "KeelJobRecoveryUnknown")
    assert unknown["for"] == "10m"


#: PromQL words that are not series: functions, aggregations, keywords.
PROMQL_WORDS = frozenset(
    "absent absent_over_time increase rate irate delta max min sum avg count by without on "
    "ignoring group_left group_right and or unless bool offset histogram_quantile "
    "max_over_time min_over_time avg_over_time changes resets time vector scalar".split()
)


def series_read_by(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers once strings, label
    matchers, ranges and grouping clauses are taken out, less PromQL's own words."""
    import re

    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*", bare))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"\d+\w*", w)}
