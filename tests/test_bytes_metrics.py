"""Bytes beside rows: the data plane counts the Arrow size of the batches a reader reads and
writes (``RecordBatch.nbytes``, whole batches), a task group carries them, and the REST payloads
and /metrics show them next to the rows."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from engine import counters
from engine.connectors.batches import bounded, limits
from engine.connectors.schema import Schema
from engine.jobs.planner import plan_job
from engine.member.dataplane import Counters, instantiate, run_reader, sized_parts
from engine.models import TaskGroup
from engine.states import JobMode
from tests.conftest import role_user
from tests.dirtykit import running_job

ROWS = 40_000  # per split: three batches of the data plane's size, the last short
CHAIN = """env {{ job.mode = BATCH }}
source {{ FakeSource {{ plugin_output = fake, row.num = {rows}, split.num = 2 }} }}
transform {{
  FieldMapper {{ plugin_input = fake, plugin_output = ids, field_mapper {{ id = id }} }}
}}
sink {{
  Blackhole {{ plugin_input = ids }}
  Blackhole {{ plugin_input = fake }}
}}"""


def run(config: str) -> tuple[Counters, dict]:
    """The job's one pipeline read by one reader; its counters and its plan."""
    data = plan_job(config, None, {}).pipelines[0].to_json()
    splits = instantiate(data["source"]).create_splits(JobMode.BATCH)
    counted = run_reader(
        data,
        [{"splitId": s["splitId"], "split": s, "offset": 0} for s in splits],
        JobMode.BATCH,
        {"jobId": 1, "pipelineId": 1, "readerIndex": 0, "attempt": 1},
        threading.Event(),
        on_progress=lambda counters, current: None,
        on_split_done=lambda split_id, offset: None,
    )
    return counted, data


def source_batches(data: dict) -> list[pa.RecordBatch]:
    """The batches the source's splits make, as the data plane bounds them."""
    source = instantiate(data["source"])
    max_rows, max_bytes = limits()
    return [
        part
        for split in source.create_splits(JobMode.BATCH)
        for batch, _ in source.read(split, 0, JobMode.BATCH, max_rows)
        for part in bounded(batch, max_rows, max_bytes)
    ]


def test_a_reader_counts_the_bytes_of_the_batches_it_reads_and_writes():
    counted, data = run(CHAIN.format(rows=2 * ROWS))  # row.num is per reader: 2 splits
    batches = source_batches(data)
    read = sum(b.nbytes for b in batches)
    mapper = instantiate(data["transforms"][0])
    mapped = mapper.processor(Schema.from_json(data["source"]["schema"]))
    assert counted.received == 2 * ROWS and counted.written == 4 * ROWS
    assert counted.received_bytes == read > 0
    # One sink takes the source's batches as they are, the other only their bigint ids.
    assert counted.written_bytes == read + sum(mapped(b).nbytes for b in batches)
    assert sum(mapped(b).nbytes for b in batches) == 8 * 2 * ROWS


def test_a_batch_within_the_bounds_is_measured_once_and_a_sliced_one_slice_by_slice():
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(10), pa.int64())})
    assert list(sized_parts(batch, 10, 1 << 20)) == [(batch, 80)]
    parts = list(sized_parts(batch, 4, 1 << 20))
    assert [(p.num_rows, size) for p, size in parts] == [(4, 32), (4, 32), (2, 16)]


def scrape(client) -> dict[str, float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if not sample.labels
    }


@pytest.mark.django_db(transaction=True)
def test_task_groups_bytes_show_in_the_api_and_in_prometheus_beside_their_rows(engine, client):
    job, _ = running_job(engine, members=2)
    TaskGroup.objects.filter(job=job, kind="READER").update(
        source_received=500, sink_written=400, source_received_bytes=5000, sink_written_bytes=4000
    )
    readers = TaskGroup.objects.filter(job=job, kind="READER").count()
    counters.bump([(counters.BYTES_RETIRED, "read", 7), (counters.BYTES_RETIRED, "written", 3)])

    samples = scrape(client)
    assert samples["keel_rows_read_total"] == 500 * readers
    assert samples["keel_bytes_read_total"] == 5000 * readers + 7
    assert samples["keel_bytes_written_total"] == 4000 * readers + 3

    api = APIClient()
    api.force_authenticate(role_user("bytes-viewer", "viewer"))
    detail = api.get(f"/api/v1/jobs/{job.id}").json()
    assert detail["metrics"]["sourceReceivedBytes"] == 5000 * readers
    assert detail["metrics"]["sinkWriteBytes"] == 4000 * readers
    groups = [g for p in detail["pipelines"] for g in p["taskGroups"] if g["kind"] == "READER"]
    assert {
        (g["metrics"]["sourceReceivedCount"], g["metrics"]["sourceReceivedBytes"]) for g in groups
    } == {(500, 5000)}
    info = api.get(f"/job-info/{job.id}").json()
    assert info["metrics"]["SourceReceivedBytes"] == str(5000 * readers)
    assert info["metrics"]["SinkWriteBytes"] == str(4000 * readers)
