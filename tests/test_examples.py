"""Every example job is a valid job, and the LocalFile examples run end to end on a cluster."""

from __future__ import annotations

import json
import os

import pytest

from devcluster.examples import (
    DEMO_SET,
    EXAMPLES_DIR,
    example_files,
    prepare_examples_db,
    save_examples_connection,
)
from engine.jobs.planner import plan_job
from tests.clusterkit import SERVER_URL, Cluster, admin_conn

SEATUNNEL_STYLE = """
env { job.mode = "BATCH", parallelism = 1, spark.app.name = "from-spark" }
source {
  fakesource {
    result_table_name = "fake", parallelism = 2, split.num = 2, row.num = 25
    schema { fields { id = bigint } }
  }
}
sink {
  localfile { source_table_name = "fake", path = "OUT", file_format_type = "json" }
}
"""


@pytest.fixture(scope="module")
def examples_db():
    name = f"keel_examples_test_{os.getpid()}"
    url = prepare_examples_db(SERVER_URL + "/postgres", name)
    yield url
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_there_is_a_batch_and_a_streaming_example_for_each_connector():
    names = [p.name for p in example_files()]
    text = {p.name: p.read_text() for p in example_files()}
    for plugin in ("FakeSource", "Console", "Blackhole", "LocalFile", "Jdbc"):
        for mode in ("BATCH", "STREAMING"):
            assert any(plugin in text[n] and f"job.mode = {mode}" in text[n] for n in names), (
                plugin,
                mode,
            )
    assert all((EXAMPLES_DIR / n).exists() for n in DEMO_SET)


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_example_plans(path, examples_db, tmp_path, db):
    save_examples_connection(examples_db, SERVER_URL + "/postgres")
    (tmp_path / "fake-csv").mkdir()  # what the CSV example reads, as the other one writes it
    (tmp_path / "fake-csv" / "part-1-1-0.csv").write_text("id,name,score\n1,a,0.5\n")
    plan = plan_job(path.read_text().replace(".var/data/examples", str(tmp_path)))
    assert plan.pipelines and plan.slots_needed >= 2


@pytest.mark.cluster
def test_localfile_examples_run_on_a_cluster(db_template, tmp_path):
    """FakeSource -> Filter -> CSV, then CSV -> RowFilter -> JSON lines, with ./run submit."""
    cluster = Cluster(db_template, masters=1, workers=1, slots=4)
    try:
        cluster.up()
        outputs = []
        for name in ("fake_to_localfile.batch.conf", "localfile_to_localfile.batch.conf"):
            text = (EXAMPLES_DIR / name).read_text().replace(".var/data/examples", str(tmp_path))
            conf = tmp_path / name
            conf.write_text(text)
            proc = cluster.run("submit", str(conf), "--wait", "--timeout", "120")
            outputs.append(proc.stderr)
        # A job file as SeaTunnel users write them runs unchanged, warned about, not refused.
        conf = tmp_path / "seatunnel-style.conf"
        conf.write_text(SEATUNNEL_STYLE.replace("OUT", str(tmp_path / "seatunnel")))
        proc = cluster.run("submit", str(conf), "--wait", "--timeout", "120")
        assert "warning: env.spark.app.name: ignored: an option of Spark" in proc.stderr
    finally:
        cluster.down()
    parts = sorted((tmp_path / "seatunnel").glob("part-*.jsonl"))
    seatunnel = [json.loads(ln) for p in parts for ln in p.read_text().splitlines()]
    assert sorted(r["id"] for r in seatunnel) == list(range(50))
    assert len(parts) == 2  # a part per reader: the source's own parallelism, not the job's 1
    csv_lines = [
        ln for p in (tmp_path / "fake-csv").glob("part-*.csv") for ln in p.read_text().splitlines()
    ]
    assert sum(1 for ln in csv_lines if ln == "id,name,score") == 2  # a header per reader part
    assert len(csv_lines) == 4000 + 2
    records = [
        json.loads(ln)
        for p in (tmp_path / "high-scores").glob("part-*.jsonl")
        for ln in p.read_text().splitlines()
    ]
    # score = id * 0.5, kept where score >= 250: ids 500..3999
    assert sorted(r["id"] for r in records) == list(range(500, 4000))
    assert set(records[0]) == {"id", "name", "score"}
