"""Worker tags on a real cluster (``./run cluster up --worker-tags``): SeaTunnel's own
resource-isolation job files run only on the worker whose tags match their ``tag_filter``, and
one that no worker matches is refused, saying so (SeaTunnel fails it with
NoEnoughResourceException)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.clusterkit import ROOT, RUN, Cluster, run_batch_job

pytestmark = pytest.mark.cluster

#: SeaTunnel's resource-isolation/fakesource_to_console.conf, as its e2e test runs it.
MATCHING = """
env {
  job.mode = "BATCH"
  tag_filter {
    group = "platform"
    team = "team1"
  }
}
source {
  FakeSource {
    result_table_name = "fake"
    schema {
      fields {
        id = "int"
        name = "string"
        age = "int"
      }
    }
  }
}
sink {
  console {
  }
}
"""
#: fakesource_to_console_tag_not_match.conf: the same job with tags no worker has.
NOT_MATCHING = MATCHING.replace('"platform"', '"error_tag"').replace('"team1"', '"error_tag"')


@pytest.fixture(scope="module")
def tagged(db_template):
    """worker-1 tagged as SeaTunnel's e2e member is (group=platform, team=team1), and every
    worker zone=a."""
    tags = ("--worker-tags", "worker-1:group=platform,team=team1", "--worker-tags", "zone=a")
    with Cluster(db_template, masters=1, workers=2, slots=4, extra_args=tags) as c:
        yield c


def test_the_members_api_shows_each_workers_tags(tagged):
    code, body = tagged.api("/api/v1/members")
    assert code == 200, body
    members = body["results"] if isinstance(body, dict) else body
    tags = {m["name"]: m["tags"] for m in members if m["state"] == "ALIVE"}
    assert tags == {
        "worker-1": {"group": "platform", "team": "team1", "zone": "a"},
        "worker-2": {"zone": "a"},
    }


def test_a_job_with_tag_filter_runs_only_on_the_matching_worker(tagged):
    # Without the filter its two task groups would be spread over both workers (slot order).
    job_id = run_batch_job(tagged, MATCHING, "the tagged job", timeout=120)
    hosts = tagged.query(
        "SELECT m.name FROM engine_taskgroup g JOIN engine_member m ON m.id = g.member_id "
        "WHERE g.job_id = %s",
        (job_id,),
    )
    assert hosts == [("worker-1",), ("worker-1",)]


def test_a_job_no_worker_matches_is_refused_saying_why(tagged):
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as fh:
        fh.write(NOT_MATCHING)
    proc = subprocess.run(
        [RUN, "submit", fh.name],
        cwd=ROOT,
        env=tagged.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    Path(fh.name).unlink()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = (
        "env.tag_filter: no live worker matches tag_filter {group: error_tag, team: error_tag}"
    )
    assert message in proc.stderr
    assert tagged.one("SELECT count(*) FROM engine_job WHERE status = 'PENDING'") == 0
