"""Lane A on a real cluster: the enumerator task group runs the coordinator event loop, the
reader task groups run the reader event loop, and commands cross between workers as versioned
envelopes admitted into the readers' bounded mailboxes.

- A BATCH FakeSource job in Lane A finishes with every row exactly once, and job detail shows
  each task group's runtime metrics (mailbox, admissions, assignments).
- The enumerator's assignment tracker, as job detail counts it, holds each new file's split
  APPLIED (its reader acknowledged it) until a completed checkpoint proves it (a STREAMING job
  that checkpoints once).
- A STREAMING LocalFile job given 200 small files takes each assignment through APPLIED and
  CHECKPOINT_INCLUDED (its readers' snapshot metadata) to GC_ELIGIBLE, and ends with its
  readers' state and metadata holding no file: bounded by the unfinished files, not by 200.
- A STREAMING LocalFile job in Lane A into Jdbc, discovering new files every 200 ms, survives
  kill -9 of a reader's worker and then of the enumerator's worker: files dropped before, during
  and after the kills are all read, and every row is in the table exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import psycopg
import pytest

from engine.sourceruntime.choices import AssignmentState
from tests.clusterkit import Cluster, wait_for, wait_for_api
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster
ROWS_PER_FILE = 50
#: A file large enough that a kill lands while it is partly read and partly committed.
#: Lane A reads Arrow blocks: 80,000 rows were all read and committed within one checkpoint.
BIG_FILE = 800_000
#: A BATCH reader of a file this large is still reading after several checkpoints even when
#: they come late (a loaded machine delayed the first by 2.5 s, by when 80,000 rows were read),
#: now that Lane A reads Arrow blocks (400,000 rows were all read and committed in about 3 s).
HUGE_FILE = 1_200_000
#: The enumerator's bound on pending splits (new files waiting for a reader).
MAX_PENDING = 40


@pytest.fixture(scope="module")
def lane_a(db_template):
    """4 workers of 1 slot: an enumerator and 2 readers each on a worker of its own, and room
    to restore them after losing one."""
    c = Cluster(db_template, masters=1, workers=4, slots=1, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource,LocalFile"
    # Fewer than a job's first scan finds: the rest wait on disk for later scans.
    c.env["KEEL_SOURCE_RUNTIME_DISCOVERY_MAX_PENDING"] = str(MAX_PENDING)
    with c:
        yield c


def group(detail: dict, kind: str, index: int = 0) -> dict:
    groups = detail["pipelines"][0]["taskGroups"]
    return next(g for g in groups if g["kind"] == kind and g["index"] == index)


def test_a_batch_fakesource_job_runs_in_lane_a_exactly_once(lane_a, tmp_path):
    lane_a.restore()
    out = tmp_path / "out"
    job_id = submit(
        lane_a,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 2, checkpoint.interval = 500 }}
        source {{ FakeSource {{ row.num = 7500, split.num = 3,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ LocalFile {{ path = "{out}", file_format_type = csv }} }}
        """),
    )
    detail = wait_status(lane_a, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FINISHED", detail
    pipeline = detail["pipelines"][0]
    assert pipeline["sourceRuntime"]["lane"] == "A"
    ids = [
        int(line.split(",")[0])
        for f in sorted(out.rglob("*.csv"))
        for line in f.read_text().splitlines()
        if line
    ]
    # SeaTunnel's splits: 3 of 2,500 rows for each of the 2 readers, each row once
    assert sorted(ids) == list(range(15000))
    enumerator = group(detail, "ENUMERATOR")["sourceRuntime"]
    # 6 splits and 2 no-more-splits, each admitted (its answer DUPLICATE when the one to its
    # first delivery came after the resend's, on a loaded machine); the registration
    # confirmations' answers may come after the enumerator's last report
    answers = enumerator["admissions"]
    assert answers.get("ACCEPTED", 0) + answers.get("DUPLICATE", 0) >= 6 + 2, pipeline
    assert set(enumerator["mailbox"]) == {"commands", "bytes", "reservedInUse", "oldestAgeMs"}
    held = enumerator["assignments"]  # every split admitted, each proven or not yet
    assert held["UNASSIGNED"] == held["DISPATCHED"] == 0 and sum(held.values()) <= 6
    assert enumerator["assignmentsReached"]["DISPATCHED"] == 6  # each split once
    readers = [group(detail, "READER", i)["sourceRuntime"] for i in (0, 1)]
    assert sum(r["assignments"]["APPLIED"] for r in readers) == 6
    assert all(r["admissions"].get("ACCEPTED", 0) >= 2 for r in readers)
    assert all(r["poll"]["records"] > 0 for r in readers)


def test_a_lane_a_readers_console_rows_are_in_its_logs(lane_a):
    """The reader event loop's thread writes the sinks: Console's rows are shipped as the reader
    task group's log lines (engine.member.tasklogs), read back through the API."""
    lane_a.restore()
    job_id = submit(
        lane_a,
        "env { job.mode = BATCH, parallelism = 2 }\n"
        "source { FakeSource { row.num = 3, schema { fields { id = bigint } } } }\n"
        "sink { Console { } }\n",
    )
    detail = wait_status(lane_a, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FINISHED", detail
    assert detail["pipelines"][0]["sourceRuntime"]["lane"] == "A"
    readers = {group(detail, "READER", i)["taskGroupId"] for i in (0, 1)}

    def console() -> list[dict]:
        code, body = lane_a.api(f"/api/v1/jobs/{job_id}/logs")
        assert code == 200, body
        return [line for line in body["results"] if line["logger"] == "keel.sink.console"]

    lines = wait_for(lambda: len(c := console()) >= 6 and c, 15, interval=0.2, what="the rows")
    assert sorted(line["taskGroupId"] for line in lines) == sorted([*readers] * 3)


def tracked(**counts: int) -> dict[str, int]:
    """The enumerator's assignment counts as job detail shows them: every state, these set."""
    return {**{state.value: 0 for state in AssignmentState}, **counts}


def test_the_tracker_holds_each_new_split_until_a_checkpoint_proves_it(lane_a, tmp_path):
    """Checkpoints every 10 minutes: the first, at the start, completes before any file is
    there; each file dropped after it is a split the tracker keeps APPLIED (admitted, and
    acknowledged by its reader as applied, proven by no checkpoint), so the enumerator's
    reports count 1, then 2, then 3."""
    lane_a.restore()
    inbox = Inbox(tmp_path / "tracked")
    inbox.directory.mkdir()
    job_id = submit(
        lane_a,
        localfile_job(
            inbox.directory,
            "job.mode = STREAMING, parallelism = 2, checkpoint.interval = 600000",
            "Blackhole { }",
        ),
    )

    def counts() -> dict | None:
        runtime = group(job(lane_a, job_id), "ENUMERATOR").get("sourceRuntime") or {}
        return runtime.get("assignments")

    def applied() -> int:  # the readers' own reports, which come on their own time
        detail = job(lane_a, job_id)
        runtimes = [group(detail, "READER", i).get("sourceRuntime") or {} for i in (0, 1)]
        return sum(r.get("assignments", {}).get("APPLIED", 0) for r in runtimes)

    try:
        wait_for(lambda: lane_a.checkpoints_completed(job_id) == 1, 30, what="a checkpoint")
        for n in (1, 2, 3):
            inbox.drop()
            wait_for_api(lambda n=n: counts() == tracked(APPLIED=n), 30, what=f"{n} tracked")
        assert counts() == tracked(APPLIED=3)  # still: no checkpoint proved them
        # Each reader's own count: the files it holds unfinished (each is read to its end).
        wait_for(lambda: applied() == 0, 15, interval=0.05, what="the readers' files read")
    finally:  # its slots are the module's next tests'
        assert post(lane_a, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        assert wait_status(lane_a, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"


def test_assignments_are_proven_by_metadata_and_reader_state_stays_bounded(lane_a, tmp_path):
    """200 small files, half before the job starts, half while it runs: every assignment is
    acknowledged (APPLIED), included by a reader snapshot's metadata (CHECKPOINT_INCLUDED) and
    collected once its checkpoint completed (GC_ELIGIBLE); the readers' checkpointed state and
    metadata end holding no file, and their reports count no file held. The first scan finds
    more files than the enumerator takes (MAX_PENDING): the rest wait on disk for later scans
    and come then, none twice."""
    lane_a.restore()
    inbox = Inbox(tmp_path / "many")
    inbox.directory.mkdir()
    for _ in range(100):
        inbox.drop(rows=5)
    job_id = submit(
        lane_a,
        localfile_job(
            inbox.directory,
            "job.mode = STREAMING, parallelism = 2, checkpoint.interval = 300",
            "Blackhole { }",
            discovery=100,
        ),
    )

    def runtimes() -> tuple[dict, list[dict]]:
        detail = job(lane_a, job_id)
        readers = [group(detail, "READER", i).get("sourceRuntime") or {} for i in (0, 1)]
        return group(detail, "ENUMERATOR").get("sourceRuntime") or {}, readers

    def reached() -> dict:
        return runtimes()[0].get("assignmentsReached") or {}

    try:
        wait_for(lambda: lane_a.checkpoints_completed(job_id) >= 1, 30, what="a checkpoint")
        for _ in range(100):
            inbox.drop(rows=5)
        wait_for_api(
            lambda: reached().get("GC_ELIGIBLE") == 200, 60, what="every assignment collected"
        )
        assert runtimes()[0]["assignments"] == tracked()  # nothing tracked any more
        assert reached()["APPLIED"] >= 1 and reached()["CHECKPOINT_INCLUDED"] >= 1

        def read_all_and_hold_none() -> bool:  # the readers report once a second
            readers = runtimes()[1]
            return sum(r["poll"]["records"] for r in readers) == 200 * 5 and not sum(
                r["assignments"]["APPLIED"] for r in readers
            )

        wait_for_api(read_all_and_hold_none, 15, what="the readers' reports of every row")
        wait_for(lambda: held(lane_a, job_id) == (0, 0), 15, what="the snapshots' files gone")
        assert runtimes()[0]["discovery"]["throttledScans"] >= 1  # 100 files, room for 40
    finally:  # its slots are the module's next tests'
        assert post(lane_a, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        assert wait_status(lane_a, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"


def held(cluster: Cluster, job_id: int) -> tuple[int, int]:
    """Files its readers' newest snapshots in completed checkpoints hold: (splits in their
    connector state, split ids in their metadata's recent assignments)."""
    rows = cluster.query(
        """
        SELECT DISTINCT ON (t.task_group_id) t.state
          FROM engine_taskcheckpoint t
          JOIN engine_taskgroup g ON g.id = t.task_group_id
          JOIN engine_checkpoint c ON c.id = t.checkpoint_id
         WHERE g.job_id = %s AND g.kind = 'READER' AND c.state = 'COMPLETED'
         ORDER BY t.task_group_id, t.checkpoint_id DESC
        """,
        (job_id,),
    )
    managed = [json.loads(state)["managed"] for (state,) in rows]
    splits = sum(len(m["state"]["splits"]) for m in managed)
    recent = sum(len(ids) for m in managed for _, _, ids in m["metadata"]["recentAssignments"])
    return splits, recent


class Inbox:
    """The source directory, and the files the test drops into it: ids run on across files."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.files, self.rows = directory, 0, 0

    def drop(self, rows: int = ROWS_PER_FILE) -> int:
        """A new file, whole when it appears (written hidden, then renamed); its first id."""
        first = self.rows
        hidden = self.directory / f".part-{self.files}"
        hidden.write_text("".join(f"{i},f{self.files}\n" for i in range(first, first + rows)))
        os.rename(hidden, self.directory / f"in-{self.files:04d}.csv")
        self.files += 1
        self.rows += rows
        return first


def localfile_job(directory: Path, env: str, sink: str, discovery: int | None = 200) -> str:
    """A job's config reading the csv files of (id, name) in ``directory``: ``env`` and ``sink``
    are its env block's settings and its sink; ``discovery`` its discovery interval (ms)."""
    every = "" if discovery is None else f"file.discovery.interval = {discovery},"
    return textwrap.dedent(f"""
        env {{ {env} }}
        source {{ LocalFile {{ path = "{directory}", file_format_type = csv, {every}
                              schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ {sink} }}
        """)


def jdbc_sink(url: str) -> str:
    """The Jdbc sink writing into ``empty_table``'s table at ``url``."""
    return f'Jdbc {{ url = "{url}", user = root, password = t, table = lane_a }}'


def start_streaming_into_table(cluster: Cluster, data_db: str, inbox: Inbox, retries: int) -> int:
    """A STREAMING Lane A job reading ``inbox`` into a new ``lane_a`` table (checkpoints every
    300 ms, restored at once up to ``retries`` times), once its first 3 files are committed."""
    url = empty_table(data_db)
    for _ in range(3):
        inbox.drop()
    job_id = submit(
        cluster,
        localfile_job(
            inbox.directory,
            "job.mode = STREAMING, parallelism = 2, checkpoint.interval = 300,"
            f" job.retry.interval.seconds = 0, job.retry.times = {retries}",
            jdbc_sink(url),
        ),
    )
    detail = wait_status(cluster, job_id, {"RUNNING"}, timeout=30)
    assert detail["pipelines"][0]["sourceRuntime"]["lane"] == "A"
    wait_for(
        lambda: committed(data_db) == (inbox.rows, inbox.rows),
        30,
        interval=0.2,
        what="the first files committed",
    )
    return job_id


def empty_table(data_db: str) -> str:
    """The sink's table, new and empty, with no key (duplicates show); its Jdbc URL."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS lane_a, lane_a__keel_stage")
        conn.execute("CREATE TABLE lane_a (id bigint, name text)")
    return "jdbc:" + data_db.replace("postgres://", "postgresql://")


def committed(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*), count(DISTINCT id) FROM lane_a").fetchone()


def test_a_streaming_localfile_job_survives_reader_and_enumerator_kills(lane_a, data_db, tmp_path):
    """Each kill lands while a large file is partly read and partly committed: the restored
    reader goes on from its checkpointed offset, so nothing is lost and nothing written twice."""
    lane_a.restore()
    inbox = Inbox(tmp_path / "inbox")
    inbox.directory.mkdir()
    job_id = start_streaming_into_table(lane_a, data_db, inbox, retries=5)

    def all_read() -> bool:
        return committed(data_db) == (inbox.rows, inbox.rows)

    for victim_kind, restores in (("READER", 1), ("ENUMERATOR", 2)):
        detail = job(lane_a, job_id)
        victim = group(detail, victim_kind)["member"]["name"]
        enumerator_host = group(detail, "ENUMERATOR")["member"]["name"]
        assert victim_kind == "ENUMERATOR" or victim != enumerator_host
        before = inbox.rows
        inbox.drop(BIG_FILE)
        wait_for(
            lambda b=before: b + 2000 < committed(data_db)[0] < b + BIG_FILE - 2000,
            30,
            interval=0.05,
            what="the large file partly committed",
        )
        lane_a.signal(victim, signal.SIGKILL)
        for _ in range(3):  # dropped while the pipeline is being restored
            inbox.drop()
        wait_for(
            lambda n=restores: (
                (p := job(lane_a, job_id)["pipelines"][0])["restoreCount"] == n
                and p["status"] == "RUNNING"
            ),
            30,
            interval=0.1,
            what=f"the restore after the {victim_kind.lower()}'s worker died",
        )
        lane_a.start(victim)
        inbox.drop()
        wait_for(all_read, 60, interval=0.2, what=f"all {inbox.files} files")

    count, distinct = committed(data_db)
    assert count == distinct == inbox.rows
    with psycopg.connect(data_db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM lane_a"))
    assert ids == list(range(inbox.rows))
    detail = job(lane_a, job_id)
    assert detail["jobStatus"] == "RUNNING" and detail["pipelines"][0]["restoreCount"] == 2
    assert post(lane_a, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(lane_a, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    assert committed(data_db) == (count, count)  # what was committed stays, nothing twice


def test_a_batch_job_restored_after_one_reader_finished_reads_nothing_twice(
    lane_a, data_db, tmp_path
):
    """A small file and a large one: the reader of the small one finishes (its final
    checkpoint committed, later checkpoints expect no ack of it); then the other reader's worker
    is killed mid-file. The restore gives the finished reader what its final snapshot held, so
    the small file is not read again, and the large one goes on from its checkpointed offset."""
    lane_a.restore()
    inbox = Inbox(tmp_path / "batch")
    inbox.directory.mkdir()
    inbox.drop(ROWS_PER_FILE)  # in-0000: reader 0's
    inbox.drop(HUGE_FILE)  # in-0001: reader 1's
    url = empty_table(data_db)
    job_id = submit(
        lane_a,
        localfile_job(
            inbox.directory,
            "job.mode = BATCH, parallelism = 2, checkpoint.interval = 300,"
            " job.retry.interval.seconds = 0, job.retry.times = 3",
            jdbc_sink(url),
            discovery=None,
        ),
    )
    wait_for(
        lambda: (
            group(job(lane_a, job_id), "READER", 0)["status"] == "FINISHED"
            and ROWS_PER_FILE + 2000 < committed(data_db)[0] < inbox.rows - 2000
        ),
        30,
        interval=0.05,
        what="reader 0 finished and the large file partly committed",
    )
    victim = group(job(lane_a, job_id), "READER", 1)["member"]["name"]
    lane_a.signal(victim, signal.SIGKILL)
    detail = wait_status(lane_a, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FINISHED", detail
    assert detail["pipelines"][0]["restoreCount"] == 1
    assert committed(data_db) == (inbox.rows, inbox.rows)
