"""Jobs on a real cluster: they move real data between real systems."""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
import textwrap
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from engine.protocol import TASK_CANCEL, TASK_MEMBER_COMMANDS, member_queue
from tests.clusterkit import ROOT, RUN, SERVER_URL, Cluster, admin_conn, wait_for, wait_for_api

pytestmark = pytest.mark.cluster
TERMINAL = {"FINISHED", "FAILED", "CANCELED"}


@pytest.fixture(scope="module")
def jc(db_template):
    """A cluster with 2 workers of 4 fixed slots each (8 slots); no test here hurts a master, so
    it has one."""
    with Cluster(db_template, masters=1, workers=2, slots=4, heartbeat_timeout=3.0) as c:
        yield c


def post(c: Cluster, path: str, body: dict | None = None) -> tuple[int, dict]:
    return c.post(path, body)


def submit(c: Cluster, config: str) -> int:
    code, body = post(c, "/api/v1/jobs", {"config": config})
    assert code == 201, body
    return body["jobId"]


def job(c: Cluster, job_id: int) -> dict:
    code, body = c.api(f"/api/v1/jobs/{job_id}")
    assert code == 200
    return body


def wait_status(c: Cluster, job_id: int, statuses: set[str], timeout: float = 60) -> dict:
    return wait_for(
        lambda: (d := job(c, job_id))["jobStatus"] in statuses and d,
        timeout,
        interval=0.1,
        what=f"job {job_id} to reach {statuses}",
    )


def free_slots(c: Cluster) -> int:
    code, slots = c.api("/api/v1/slots")
    assert code == 200
    return sum(1 for s in slots if s["state"] == "FREE" and s["owner"] is None)


def test_batch_fake_source_to_local_csv_via_the_cli(jc, tmp_path):
    """FINISHED with exactly the expected rows, none twice (./run submit --wait)."""
    out = tmp_path / "out"
    config = tmp_path / "job.conf"
    config.write_text(
        textwrap.dedent(f"""
        env {{
          job.name = fake-to-csv
          job.mode = BATCH
          parallelism = 2
        }}
        source {{
          FakeSource {{
            row.num = 2000
            split.num = 4
            schema {{ fields {{ id = bigint, name = string }} }}
          }}
        }}
        sink {{
          LocalFile {{ path = "{out}", file_format_type = csv }}
        }}
    """)
    )
    proc = subprocess.run(
        [RUN, "submit", str(config), "--wait", "--timeout", "120"],
        cwd=ROOT,
        env=jc.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = int(proc.stdout.strip().splitlines()[0])
    # SeaTunnel's count: row.num rows for each of the 2 readers, in 4 splits each.
    assert f"job {job_id} FINISHED: 4000 rows read, 4000 written" in proc.stderr
    rows = []
    for part in sorted(out.glob("part-*.csv")):
        with part.open(newline="") as fh:
            rows += [tuple(r) for r in csv.reader(fh)]
    assert len(rows) == 4000
    assert sorted(int(r[0]) for r in rows) == list(range(4000))
    assert all(r[1] == f"name-{r[0]}" for r in rows)
    assert not list((out / ".keel-tmp").glob("*"))  # nothing left unpublished
    detail = job(jc, job_id)
    assert detail["metrics"]["sourceReceivedCount"] == 4000
    assert detail["metrics"]["sinkWriteCount"] == 4000
    assert free_slots(jc) == 8


@pytest.fixture
def data_db():
    name = f"keel_data_{os.getpid()}"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{SERVER_URL}/{name}"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_jdbc_to_jdbc_through_a_transform_100k_rows(jc, data_db):
    """Jdbc -> FieldMapper -> Jdbc between two tables of 100,000 rows."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, name text, value double precision)")
        conn.execute(
            "INSERT INTO src SELECT g, 'name-' || g, g * 0.25 FROM generate_series(1, 100000) g"
        )
        conn.execute("CREATE TABLE dst (key bigint PRIMARY KEY, label text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(
        jc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 2 }}
        source {{ Jdbc {{ url = "{url}", user = root, password = t, table = src, split.num = 4 }} }}
        transform {{ FieldMapper {{ field_mapper {{ id = key, name = label }} }} }}
        sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = dst,
                        primary_keys = [key] }} }}
    """),
    )
    detail = wait_status(jc, job_id, TERMINAL, timeout=180)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    with psycopg.connect(data_db) as conn:
        assert conn.execute("SELECT count(*) FROM dst").fetchone()[0] == 100000
        mismatched = conn.execute(
            "SELECT count(*) FROM (SELECT id, name FROM src EXCEPT SELECT key, label FROM dst) x"
        ).fetchone()[0]
        assert mismatched == 0
    assert detail["metrics"]["sinkWriteCount"] == 100000


def test_bad_jdbc_target_is_a_400_naming_the_option(jc, data_db):
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    code, body = post(
        jc,
        "/api/v1/jobs",
        {
            "config": (
                "source { FakeSource { } }\n"
                f'sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = nope,'
                " schema_save_mode = ERROR_WHEN_SCHEMA_NOT_EXIST } }"
            )
        },
    )
    assert code == 400
    assert body["errors"][0]["path"] == "sink[0].Jdbc.table"


STREAMING_TWO_CHAINS = """
env { job.mode = STREAMING, parallelism = 1 }
source {
  FakeSource { plugin_output = a, rows.per-second = 200, endless = true }
  FakeSource { plugin_output = b, rows.per-second = 200, endless = true }
}
sink {
  Blackhole { plugin_input = a }
  Blackhole { plugin_input = b }
}
"""


def test_two_independent_chains_are_two_running_pipelines(jc):
    """One job, two pipelines, both running; cancel frees every slot."""
    job_id = submit(jc, STREAMING_TWO_CHAINS)
    detail = wait_status(jc, job_id, {"RUNNING"}, timeout=30)
    assert [p["status"] for p in detail["pipelines"]] == ["RUNNING", "RUNNING"]
    assert len(detail["pipelines"]) == 2
    wait_for_api(
        lambda: all(
            p["taskGroups"][1]["metrics"]["sourceReceivedCount"] > 0
            for p in job(jc, job_id)["pipelines"]
        ),
        15,
        what="rows flowing in both pipelines",
    )
    code, _ = post(jc, f"/api/v1/jobs/{job_id}/cancel")
    assert code == 202
    assert wait_status(jc, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    wait_for_api(lambda: free_slots(jc) == 8, 10, what="every slot to be free")


def streaming(parallelism: int) -> str:
    return (
        f"env {{ job.mode = STREAMING, parallelism = {parallelism} }}\n"
        "source { FakeSource { rows.per-second = 100, endless = true } }\n"
        "sink { Blackhole { } }"
    )


def test_job_waits_pending_for_slots_and_runs_when_another_is_cancelled(jc):
    """A job needing more slots than are free stays PENDING (FIFO) and runs once
    another job is cancelled; cancel frees every slot."""
    big = submit(jc, streaming(5))  # 6 slots of 8; readers without splits idle in their slots
    wait_status(jc, big, {"RUNNING"}, timeout=30)
    assert free_slots(jc) == 2
    waiting = submit(jc, streaming(3))  # 4 slots: only 2 free
    small = submit(jc, streaming(1))  # 2 slots would fit, but FIFO keeps it behind
    overview = wait_for_api(
        lambda: (o := jc.api("/api/v1/overview")[1])["pendingJobs"] == 2 and o,
        10,
        what="two pending jobs",
    )
    assert overview["runningJobs"] == 1
    assert job(jc, waiting)["jobStatus"] == "PENDING"
    assert job(jc, small)["jobStatus"] == "PENDING"
    assert post(jc, f"/api/v1/jobs/{big}/cancel")[0] == 202
    wait_status(jc, big, {"CANCELED"}, timeout=30)
    wait_status(jc, waiting, {"RUNNING"}, timeout=30)
    wait_status(jc, small, {"RUNNING"}, timeout=30)
    for job_id in (waiting, small):
        assert post(jc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        wait_status(jc, job_id, {"CANCELED"}, timeout=30)
    wait_for_api(lambda: free_slots(jc) == 8, 10, what="every slot to be free")


def test_failing_transform_fails_the_job_with_the_plugin_and_cause(jc):
    """FAILED, errorMsg names the plugin and the cause."""
    job_id = submit(
        jc,
        """
        env { parallelism = 1 }
        source { FakeSource { row.num = 50 } }
        transform { RowFilter { field = id, op = ">", value = "not-a-number" } }
        sink { Console { } }
    """,
    )
    detail = wait_status(jc, job_id, TERMINAL, timeout=30)
    assert detail["jobStatus"] == "FAILED"
    assert "transform[0].RowFilter" in detail["errorMsg"]
    assert "invalid literal for int()" in detail["errorMsg"]
    assert detail["finishTime"] is not None
    wait_for_api(lambda: free_slots(jc) == 8, 10, what="every slot to be free")


def test_submit_cli_reports_config_errors_with_path_and_line(jc):
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as fh:
        fh.write("source {\n  FakeSource { row.num = lots }\n}\nsink { Console {} }\n")
    proc = subprocess.run(
        [RUN, "submit", fh.name], cwd=ROOT, env=jc.env, capture_output=True, text=True, timeout=60
    )
    Path(fh.name).unlink()
    assert proc.returncode == 2
    assert "source[0].FakeSource.row.num (line 2): must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dynamic_slot_workers_accept_any_number(db_template):
    """A dynamic-slot worker creates slots on demand: parallelism 6 needs 7 slots, it gets them."""
    c = Cluster(db_template, masters=1, workers=1, slots=0, extra_args=("--dynamic-slots",))
    try:
        c.up()
        assert c.api("/api/v1/overview")[1]["totalSlot"] == 0
        job_id = submit(c, streaming(6))
        detail = wait_status(c, job_id, {"RUNNING"}, timeout=30)
        slots = {t["slot"]["id"] for p in detail["pipelines"] for t in p["taskGroups"]}
        assert len(slots) == 7
        assert c.api("/api/v1/overview")[1]["assignedSlot"] == 7
        assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        wait_status(c, job_id, {"CANCELED"}, timeout=30)
    finally:
        c.down()


def test_lost_deploy_commands_are_redelivered(jc):
    """A master that commits a schedule and dies before sending the deploy commands leaves the
    intent in PostgreSQL: the active master re-sends them and the job runs."""
    epoch, _ = jc.active_master()
    # Create and schedule a job from another process, as the active master would, but never
    # send the deploy commands.
    script = (
        "import django, sys; django.setup()\n"
        "from django.db import transaction\n"
        "from engine.jobs.submission import submit_job\n"
        "from engine.jobs.scheduler import schedule_next\n"
        "with transaction.atomic():  # the real master cannot see the job before it is ours\n"
        "    job = submit_job(sys.stdin.read())\n"
        "    assert schedule_next(int(sys.argv[1]))\n"
        "print(job.id)\n"
    )
    env = dict(jc.env, DJANGO_SETTINGS_MODULE="keel.settings")
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", script, str(epoch)],
        cwd=ROOT,
        env=env,
        input=streaming(1),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job_id = int(proc.stdout.strip())
    assert job(jc, job_id)["jobStatus"] in ("SCHEDULED", "RUNNING")
    wait_status(jc, job_id, {"RUNNING"}, timeout=20)
    assert post(jc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    wait_status(jc, job_id, {"CANCELED"}, timeout=30)
    wait_for_api(lambda: free_slots(jc) == 8, 10, what="every slot to be free")


def test_jdbc_reads_null_partitions_and_upserts_repeated_keys(jc, data_db):
    """Rows whose partition column is NULL are read; a key repeated within one batch upserts
    (the last row wins) instead of failing the batch."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE src2 (id bigint PRIMARY KEY, grp int, name text)")
        conn.execute(
            "INSERT INTO src2 SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 7 END, "
            "'n' || g FROM generate_series(1, 1000) g"
        )
        conn.execute("CREATE TABLE copy2 (id bigint PRIMARY KEY, grp int, name text)")
        conn.execute("CREATE TABLE bygrp (grp int PRIMARY KEY, name text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(
        jc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 1 }}
        source {{ Jdbc {{ plugin_output = rows, url = "{url}", user = root, password = t,
                         table = src2,
                         partition_column = grp, split.num = 3 }} }}
        transform {{ Filter {{ plugin_input = rows, plugin_output = keyed,
                              include_fields = [grp, name] }}
                    RowFilter {{ plugin_input = keyed, plugin_output = grouped, field = grp,
                                 op = ">=", value = "0" }} }}
        sink {{ Jdbc {{ plugin_input = rows, url = "{url}", user = root, password = t,
                      table = copy2, primary_keys = [id] }}
               Jdbc {{ plugin_input = grouped, url = "{url}", user = root, password = t,
                       table = bygrp, primary_keys = [grp] }} }}
    """),
    )
    detail = wait_status(jc, job_id, TERMINAL, timeout=60)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    with psycopg.connect(data_db) as conn:
        assert conn.execute("SELECT count(*) FROM copy2").fetchone()[0] == 1000
        assert conn.execute("SELECT count(*) FROM copy2 WHERE grp IS NULL").fetchone()[0] == 100
        assert conn.execute("SELECT count(*) FROM bygrp").fetchone()[0] == 7


def test_a_worker_runs_every_command_of_a_batched_message(jc):
    """Commands waiting for one member go out as one message: its worker runs each, in order,
    and an entry it cannot run does not stop the ones after it."""
    job_id = submit(jc, streaming(3))
    wait_status(jc, job_id, {"RUNNING"}, timeout=30)
    member, uuid, groups = jc.query(
        "SELECT m.name, m.uuid::text, array_agg(ARRAY[t.id, t.attempt] ORDER BY t.id)"
        " FROM engine_taskgroup t JOIN engine_member m ON m.id = t.member_id"
        " WHERE t.job_id = %s AND t.status = 'RUNNING'"
        " GROUP BY 1, 2 ORDER BY count(*) DESC, 1 LIMIT 1",
        (job_id,),
    )[0]
    assert len(groups) >= 2  # 4 task groups on 2 workers
    (first, first_attempt), (second, second_attempt) = groups[:2]
    after = jc.one("SELECT coalesce(max(seq), 0) FROM engine_engineevent")
    batch = [
        [TASK_CANCEL, [first, first_attempt, uuid]],
        ["engine.no-such-command", []],
        "not a command",
        [TASK_CANCEL, [second]],  # wrong arguments: logged, the rest still run
        [TASK_CANCEL, [second, second_attempt, uuid]],
    ]
    publisher = Celery(broker=jc.redis_url, set_as_current=False)  # not this thread's app
    try:
        publisher.send_task(TASK_MEMBER_COMMANDS, args=[batch], queue=member_queue(member))
    finally:
        publisher.close()
    canceled = wait_for(
        lambda: (
            (
                rows := jc.query(
                    "SELECT (payload->>'taskGroupId')::int, (payload->>'attempt')::int"
                    " FROM engine_engineevent WHERE seq > %s AND kind = 'taskgroup.status'"
                    " AND payload->>'to' = 'CANCELED' ORDER BY seq",
                    (after,),
                )
            )
            and len(rows) >= 2
            and rows
        ),
        20,
        interval=0.1,
        what="both task groups to be cancelled",
    )
    assert sorted(canceled[:2]) == [(first, first_attempt), (second, second_attempt)]
    assert post(jc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    wait_status(jc, job_id, {"CANCELED"}, timeout=30)
    wait_for_api(lambda: free_slots(jc) == 8, 10, what="every slot to be free")
