"""The job page's sections in a real browser (Debian's chromium driven by Playwright), each
pushed live over the page's socket: the graph, a new checkpoint row, an exception after a
worker is killed under a reader, and a Console sink's log lines, none by a reload."""

from __future__ import annotations

import re
import signal

import pytest

from tests.clusterkit import wait_for
from tests.test_browser import admin_context, base_url, browser, wait_live
from tests.test_jobs_cluster import job, submit

__all__ = ["admin_context", "browser"]  # fixtures shared with the browser tests

pytestmark = pytest.mark.cluster

#: Two pipelines: source a (two rows a second) into a Console that logs each row and, with
#: source b, into a Blackhole that reads both streams; a checkpoint a second.
STREAMING = """
env { job.name = "page-depth", job.mode = STREAMING, checkpoint.interval = 1000 }
source {
  FakeSource { plugin_output = a, rows.per-second = 2, endless = true }
  FakeSource { plugin_output = b, rows.per-second = 20, endless = true }
}
sink {
  Console { plugin_input = a, limit = 100000 }
  Blackhole { plugin_input = [a, b] }
}
"""
PLUGINS = {
    "source[0].FakeSource",
    "source[1].FakeSource",
    "sink[0].Console",
    "sink[1].Blackhole@a",
    "sink[1].Blackhole@b",
}


@pytest.fixture(scope="module")
def streaming_job(cluster):
    """The module's streaming job, running; cancelled when the module ends."""
    cluster.restore()
    job_id = submit(cluster, STREAMING)
    wait_for(
        lambda: job(cluster, job_id)["jobStatus"] == "RUNNING", 60, interval=0.1, what="RUNNING"
    )
    yield job_id
    cluster.post(f"/api/v1/jobs/{job_id}/cancel")


def open_live(context, cluster, job_id: int):
    """The job's page, once its socket is up, marked so that a reload would show."""
    page = context.new_page()
    page.goto(f"{base_url(cluster)}/jobs/{job_id}/")
    page.wait_for_selector("[data-job-graph]")
    wait_live(page)
    page.evaluate("window.keelNotReloaded = true")
    return page


def not_reloaded(page) -> bool:
    return page.evaluate("window.keelNotReloaded === true")


#: The graph's boxes and chips whose texts run past their box's right edge (as drawn, in the
#: browser's own font): their texts.
OVERFLOWING = """groups => groups.filter(g => {
  const box = g.querySelector(':scope > rect').width.baseVal.value;
  return [...g.querySelectorAll('text')].some(t => t.getBBox().x + t.getBBox().width > box - 2);
}).map(g => g.textContent)"""
BOXES = "[data-job-graph] g.node, [data-job-graph] g.chip"


def test_the_graph_shows_each_plugin_with_its_pipelines_status(
    healthy, admin_context, streaming_job
):
    page = open_live(admin_context, healthy, streaming_job)
    nodes = page.locator("[data-job-graph] [data-node]")
    paths = set(nodes.evaluate_all("nodes => nodes.map(n => n.dataset.node)"))
    assert paths == PLUGINS
    wait_for(
        lambda: (
            set(nodes.evaluate_all("ns => ns.map(n => n.classList.contains('running'))")) == {True}
        ),
        30,
        interval=0.2,
        what="every plugin drawn running",
    )
    chips = page.locator("[data-job-graph] [data-graph-task-group]")
    assert chips.count() == 4  # an enumerator and a reader per pipeline
    assert "rows/s" in page.inner_text("[data-job-graph]")
    assert re.search(r"att\. \d+ · worker-", chips.first.text_content())  # its attempt
    assert page.eval_on_selector_all(BOXES, OVERFLOWING) == []
    page.screenshot(path=str(healthy.var_dir / "job-page.png"), full_page=True)
    page.close()


def test_a_new_checkpoint_row_appears_without_a_reload(healthy, admin_context, streaming_job):
    page = open_live(admin_context, healthy, streaming_job)

    def newest() -> int:
        ids = page.eval_on_selector_all(
            "[data-checkpoints] tr[data-checkpoint-id]",
            "rows => rows.map(r => Number(r.dataset.checkpointId))",
        )
        return max(ids, default=0)

    first = newest()
    wait_for(lambda: newest() > first, 30, interval=0.2, what="a newer checkpoint row")
    completed = page.locator('[data-checkpoints] tr[data-state="COMPLETED"]').first
    completed.wait_for(timeout=30_000)
    completed.locator("summary").click()  # its acknowledgements, kept open by live updates
    seq = int(page.get_attribute("#live-seq", "data-seq"))
    wait_for(
        lambda: int(page.get_attribute("#live-seq", "data-seq")) > seq,
        20,
        interval=0.1,
        what="a live update after opening the row",
    )
    assert page.locator("[data-checkpoints] details[open] li[data-ack-task-group]").count() >= 1
    assert not_reloaded(page)
    page.close()


def test_a_console_sinks_lines_appear_without_a_reload(healthy, admin_context, streaming_job):
    page = open_live(admin_context, healthy, streaming_job)
    lines = page.locator("[data-logs] [data-log-line][data-level=INFO]")
    first = lines.count()
    wait_for(lambda: lines.count() > first, 30, interval=0.2, what="new log lines, live")
    assert "sink[0].Console {'id': " in lines.last.inner_text()
    # Filtered to WARNING and up: the Console's INFO lines go, and live updates keep it so.
    page.select_option("#log-filter select[name=logLevel]", "WARNING")
    page.click("#log-filter button[type=submit]")
    page.wait_for_url("**logLevel=WARNING**")
    wait_live(page)
    seq = int(page.get_attribute("#live-seq", "data-seq"))
    wait_for(
        lambda: int(page.get_attribute("#live-seq", "data-seq")) > seq,
        20,
        interval=0.1,
        what="a live update of the filtered page",
    )
    assert page.locator("[data-logs] [data-log-line][data-level=INFO]").count() == 0
    page.close()


def test_long_names_are_cut_to_fit_their_boxes(healthy, admin_context):
    """A multi-table source's long table names: every box's and chip's text ends inside it."""
    tables = ", ".join(
        f'{{ schema {{ table = "warehouse_{n}.order_lines_kept_for_the_auditors", '
        "fields { id = bigint } } }"
        for n in (1, 2)
    )
    job_id = submit(
        healthy,
        'env { job.name = "long-names" }\n'
        "source { FakeSource { plugin_output = fake, row.num = 1, "
        f"tables_configs = [{tables}] }} }}\n"
        "transform { FilterRowKind { plugin_input = fake, plugin_output = kept, "
        "exclude_kinds = [DELETE] } }\nsink { Console { plugin_input = kept } }",
    )
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/jobs/{job_id}/")
    page.wait_for_selector("[data-job-graph] [data-node]")
    nodes = page.locator("[data-job-graph] [data-node]")
    assert nodes.count() == 6 and "…" in page.inner_text("[data-job-graph]")
    assert page.eval_on_selector_all(BOXES, OVERFLOWING) == []
    page.close()


def test_a_killed_readers_worker_shows_as_an_exception_that_restored(healthy, admin_context):
    job_id = submit(
        healthy,
        'env { job.name = "killed-under", job.mode = STREAMING, job.retry.interval.seconds = 0 }\n'
        "source { FakeSource { rows.per-second = 20, endless = true } }\nsink { Blackhole { } }",
    )
    detail = wait_for(
        lambda: (d := job(healthy, job_id))["jobStatus"] == "RUNNING" and d,
        60,
        interval=0.1,
        what="RUNNING",
    )
    reader = next(g for g in detail["pipelines"][0]["taskGroups"] if g["kind"] == "READER")
    victim, attempt = reader["member"]["name"], reader["attempt"]
    page = open_live(admin_context, healthy, job_id)
    assert page.locator("[data-exceptions] [data-exception-id]").count() == 0
    assert page.inner_text('[data-field="restores"]') == "0"
    assert victim in page.inner_text('[data-field="workers"]')
    read = wait_for(
        lambda: (n := job(healthy, job_id)["metrics"]["sourceReceivedCount"]) > 0 and n,
        30,
        interval=0.1,
        what="rows read",
    )
    healthy.signal(victim, signal.SIGKILL)
    entry = page.locator(
        f'[data-exceptions] [data-exception-id][data-member="{victim}"]'
        f'[data-attempt="{attempt}"][data-caused-restore="yes"]'
    )
    wait_for(lambda: entry.count() >= 1, 45, interval=0.2, what="the exception, restored")
    assert "member lost" in entry.first.inner_text()
    # The summary and the events say it restored, and its rows did not go back.
    wait_for(
        lambda: page.inner_text('[data-field="restores"]').startswith("1, the last "),
        45,
        interval=0.2,
        what="the restore in the summary",
    )
    events = page.locator("[data-events]")
    wait_for(
        lambda: "will be restored in" in events.inner_text(), 20, interval=0.2, what="the event"
    )
    assert "checkpoint.completed" not in events.inner_text()
    assert job(healthy, job_id)["metrics"]["sourceReceivedCount"] >= read
    assert not_reloaded(page)
    page.screenshot(path=str(healthy.var_dir / "job-exceptions.png"), full_page=True)
    page.close()
    healthy.post(f"/api/v1/jobs/{job_id}/cancel")
