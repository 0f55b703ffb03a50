"""Member-loss cost with dirty-job tracking: the time the active master's member removal
(``engine.cluster.membership.remove_member``) takes with 100 and 1,000 running
tracking-enabled jobs, beside one PostgreSQL commit measured in the same run (goal: a removal
with 1,000 jobs within 30 commits' worth).

The removal is the active master's real call, in this process on real PostgreSQL (no engine
processes): the conditional ALIVE -> REMOVED update, the member-event sequence bump, the
dirty-job tracker (``engine.dirty.on_member_lost``: incidents, episodes, their events and the
watermark every enabled job shares) and the events, in one fenced transaction, then the end of
the member's sessions.

Setup is not timed: one job is submitted with ``engine.jobs.submission.submit_job`` and cloned with
set-based SQL; jobs, pipelines and task groups are then RUNNING. Each job's task groups run on
one of 10 registered members, so losing a member affects about a tenth of the jobs (a fresh
member takes the lost member's task groups before the next removal); the worst case then loses
a member that hosts one task group of every job (most jobs have an active recovery episode by
then, which the loss continues). A commit is ``INSERT one row; COMMIT`` on a connection of its
own. After every removal the bench checks that every enabled job handled the member event and
that one ``dirty.incident`` event was appended per affected job.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

import psycopg

from tests.clusterkit import SERVER_URL, DatabaseTemplate

if TYPE_CHECKING:
    from tests.enginekit import Engine

SIZES = (100, 1000)
MEMBERS = 10
REMOVALS = 9
COMMITS = 20  # per removal
EPOCH = 7
GOAL = 30.0


class BenchError(AssertionError):
    """The engine did not do what the measurement assumes: the numbers would mean nothing."""


def setup_django(db_name: str) -> None:
    """Django in this process, on the bench's own database (not the default one)."""
    os.environ["DATABASE_URL"] = f"{SERVER_URL}/{db_name}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
    import django

    django.setup()
    use_database(db_name)  # in case Django was set up before, on another database


def use_database(db_name: str) -> None:
    """Point this process's Django connection (and the engine's dedicated sessions) at a clone."""
    from django.conf import settings
    from django.db import connection

    connection.close()
    settings.DATABASES["default"]["NAME"] = db_name
    connection.settings_dict["NAME"] = db_name


def sql(statement: str, params: dict | list | tuple | None = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def one(statement: str, params: dict | list | tuple | None = None):
    return sql(statement, params)[0][0]


def columns(model, *skip: str) -> list[str]:
    return [
        f.column
        for f in model._meta.concrete_fields
        if not (f.primary_key and f.column == "id") and f.column not in skip
    ]


def quoted(cols: list[str], prefix: str) -> str:
    return ", ".join(f'{prefix}"{c}"' for c in cols)


def create_running_jobs(count: int, members: list[int]) -> None:
    """``count`` RUNNING tracking-enabled jobs: one submitted, the rest cloned from it in SQL
    (with their DirtyJobState at the current member-event sequence); each job's task groups run
    on member ``members[job id % len(members)]``."""
    from engine.jobs.submission import submit_job
    from engine.models import DirtyJobState, Job, Pipeline, TaskGroup
    from tests.enginekit import TWO_PIPELINES

    template = submit_job(TWO_PIPELINES.format(threshold=3, retries=3)).id
    job_cols = columns(Job)
    sql(
        f"INSERT INTO engine_job ({quoted(job_cols, '')}) SELECT {quoted(job_cols, 'j.')}"
        " FROM engine_job j, generate_series(1, %s) WHERE j.id = %s",
        [count - 1, template],
    )
    p_cols = columns(Pipeline, "job_id")
    sql(
        f"INSERT INTO engine_pipeline (job_id, {quoted(p_cols, '')})"
        f" SELECT j.id, {quoted(p_cols, 'p.')} FROM engine_pipeline p, engine_job j"
        " WHERE p.job_id = %(t)s AND j.id <> %(t)s",
        {"t": template},
    )
    t_cols = columns(TaskGroup, "job_id", "pipeline_id")
    sql(
        f"INSERT INTO engine_taskgroup (job_id, pipeline_id, {quoted(t_cols, '')})"
        f" SELECT np.job_id, np.id, {quoted(t_cols, 't.')} FROM engine_taskgroup t"
        " JOIN engine_pipeline tp ON tp.id = t.pipeline_id"
        ' JOIN engine_pipeline np ON np."index" = tp."index" AND np.job_id <> %(t)s'
        " WHERE t.job_id = %(t)s",
        {"t": template},
    )
    s_cols = columns(DirtyJobState, "job_id")
    sql(
        f"INSERT INTO engine_dirtyjobstate (job_id, {quoted(s_cols, '')})"
        f" SELECT j.id, {quoted(s_cols, 's.')}"
        " FROM engine_dirtyjobstate s, engine_job j"
        " WHERE s.job_id = %(t)s AND j.id <> %(t)s",
        {"t": template},
    )
    sql("UPDATE engine_job SET status = 'RUNNING'")
    sql("UPDATE engine_pipeline SET status = 'RUNNING'")
    sql(
        "UPDATE engine_taskgroup SET status = 'RUNNING', attempt = 1, deployed_at = now(),"
        " member_id = (%s::bigint[])[job_id %% %s + 1]",
        [members, len(members)],
    )
    sql("VACUUM ANALYZE")  # a steady state: hint bits and statistics in place
    jobs, states, groups = sql(
        "SELECT (SELECT count(*) FROM engine_job WHERE status = 'RUNNING' AND dirty_threshold = 3),"
        " (SELECT count(*) FROM engine_dirtyjobstate),"
        " (SELECT count(*) FROM engine_taskgroup WHERE status = 'RUNNING')"
    )[0]
    if not jobs == states == count or groups != 4 * count:
        raise BenchError(f"setup: {jobs} jobs, {states} dirty states, {groups} groups ({count})")


class Commits:
    """``INSERT one row; COMMIT`` on a connection of its own, sampled right before every removal
    (so both see the same load on this machine)."""

    def __init__(self, db_name: str) -> None:
        self.conn = psycopg.connect(f"{SERVER_URL}/{db_name}")
        self.durability = ", ".join(
            f"{name}={self.conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("synchronous_commit", "fsync")
        )
        self.conn.execute("CREATE TABLE bench_commit (id bigserial PRIMARY KEY, at timestamptz)")
        self.conn.commit()
        self.samples: list[float] = []
        self.sample(COMMITS)  # warms the connection and the table up
        self.samples.clear()

    def sample(self, count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            self.conn.execute("INSERT INTO bench_commit (at) VALUES (now())")
            self.conn.commit()
            self.samples.append(time.perf_counter() - t0)

    def close(self) -> None:
        self.conn.close()


def affected_jobs(member_id: int) -> int:
    """Jobs the removal must register a loss for (the tracker's own definition)."""
    from engine.dirty import NOT_AFFECTED

    return one(
        "SELECT count(DISTINCT t.job_id) FROM engine_taskgroup t"
        " JOIN engine_dirtyjobstate s ON s.job_id = t.job_id"
        " WHERE t.member_id = %s AND t.status <> ALL(%s)",
        [member_id, list(NOT_AFFECTED)],
    )


def timed_removal(
    engine: Engine, member_id: int, jobs: int, commits: Commits, tracked: bool = True
) -> tuple[float, int]:
    """Remove ``member_id`` as the active master; (seconds, affected jobs), checked (when
    ``tracked``: the baseline runs with no tracking-enabled job at all)."""
    from engine.cluster import membership

    commits.sample(COMMITS)
    expected = affected_jobs(member_id)
    before = one("SELECT coalesce(max(seq), 0) FROM engine_engineevent")
    t0 = time.perf_counter()
    removed = membership.remove_member(EPOCH, member_id, "lost in the member-loss bench")
    elapsed = time.perf_counter() - t0
    engine.sessions.pop(member_id).close()
    if not removed:
        raise BenchError(f"member {member_id} was not removed")
    if not tracked:
        return elapsed, 0
    # Every enabled job handled the event: the shared watermark (engine.dirty) is up to date
    # and no job recorded a gap.
    sequence, handled, gaps, states = sql(
        "SELECT c.member_event_sequence, c.dirty_handled_sequence,"
        " (SELECT count(*) FROM engine_dirtytrackinggap),"
        " (SELECT count(*) FROM engine_dirtyjobstate) FROM engine_clusterstate c WHERE c.id = 1"
    )[0]
    behind = states if handled != sequence else gaps
    incidents, failures, rows = sql(
        "SELECT count(*) FILTER (WHERE kind = 'dirty.incident'),"
        " count(*) FILTER (WHERE kind = 'dirty.tracker-failed'),"
        " (SELECT count(*) FROM engine_memberlossincident i JOIN engine_member m"
        "   ON m.uuid = i.lost_member_uuid WHERE m.id = %s)"
        " FROM engine_engineevent WHERE seq > %s",
        [member_id, before],
    )[0]
    if states != jobs or behind:
        raise BenchError(
            f"{behind} of {states} enabled jobs did not handle member event {sequence}"
        )
    if not incidents == rows == expected or failures:
        raise BenchError(
            f"{incidents} dirty.incident events and {rows} incidents for {expected} affected "
            f"jobs ({failures} dirty.tracker-failed events)"
        )
    return elapsed, expected


def measure_size(db_name: str, jobs: int) -> tuple[tuple[list[float], str], dict]:
    """(commit samples and durability, {case: [(removal seconds, affected jobs)]}) for ``jobs``
    running jobs in ``db_name``."""

    use_database(db_name)
    from tests.enginekit import Engine  # after Django is set up: it imports the engine

    engine, commits = Engine(epoch=EPOCH), Commits(db_name)

    def register() -> int:
        return engine.add_member(slots=0).id

    try:
        ring = [register() for _ in range(MEMBERS)]
        create_running_jobs(jobs, ring)
        spread, worst, baseline = [], [], []
        # The same removals with tracking disabled for every job: what the tracker adds.
        sql("CREATE TABLE bench_saved_states AS SELECT * FROM engine_dirtyjobstate")
        sql("DELETE FROM engine_dirtyjobstate")
        for i in range(REMOVALS):
            lost = ring[i]
            baseline.append(timed_removal(engine, lost, jobs, commits, tracked=False))
            ring[i] = register()
            sql("UPDATE engine_taskgroup SET member_id = %s WHERE member_id = %s", [ring[i], lost])
        sql("INSERT INTO engine_dirtyjobstate SELECT * FROM bench_saved_states")
        sql("DROP TABLE bench_saved_states")
        sql("UPDATE engine_clusterstate SET dirty_handled_sequence = member_event_sequence")
        for i in range(REMOVALS):
            # A member of ten is lost; a fresh member then takes its task groups (a restore).
            lost = ring[i]
            spread.append(timed_removal(engine, lost, jobs, commits))
            ring[i] = register()
            sql("UPDATE engine_taskgroup SET member_id = %s WHERE member_id = %s", [ring[i], lost])
        for _ in range(REMOVALS):
            # The lost member hosts one task group of every job.
            host = register()
            sql(
                "UPDATE engine_taskgroup SET member_id = %s"
                " WHERE id IN (SELECT min(id) FROM engine_taskgroup GROUP BY job_id)",
                [host],
            )
            worst.append(timed_removal(engine, host, jobs, commits))
    finally:
        engine.close()
        commits.close()
    return (commits.samples, commits.durability), {
        "untracked (baseline)": baseline,
        "1 of 10 members": spread,
        "1 group of every job": worst,
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    template = DatabaseTemplate()
    results = {}
    try:
        databases = {jobs: template.clone() for jobs in SIZES}  # a fresh database per size
        setup_django(databases[SIZES[0]])
        logging.disable(logging.WARNING)  # the engine's member logs; errors still show
        for jobs in SIZES:
            results[jobs] = measure_size(databases[jobs], jobs)
    finally:
        logging.disable(logging.NOTSET)
        if "django.db" in sys.modules:
            from django.db import connection

            connection.close()
        template.drop_all()
    print(
        f"{'jobs':>5}  {'lost member hosts':<21} {'affected':>8}  {'n':>2}  "
        f"{'min ms':>7}  {'median ms':>9}  {'max ms':>7}  {'commit ms':>9}  commits' worth"
    )
    ratios = {}
    for jobs, ((commits, _), cases) in results.items():
        commit = statistics.median(commits)
        for case, samples in cases.items():
            times = [s for s, _ in samples]
            affected = sorted({a for _, a in samples})
            ratios[jobs, case] = statistics.median(times) / commit
            print(
                f"{jobs:>5}  {case:<21} {'/'.join(map(str, affected)):>8}  {len(times):>2}  "
                f"{ms(min(times)):>7}  {ms(statistics.median(times)):>9}  {ms(max(times)):>7}  "
                f"{ms(commit):>9}  {ratios[jobs, case]:.1f}"
            )
    commits = [s for (c, _), _ in results.values() for s in c]
    durability = results[SIZES[0]][0][1]
    print(
        f"commit = INSERT one row; COMMIT on a connection of its own ({durability}), "
        f"n={len(commits)}: min={ms(min(commits))} ms median={ms(statistics.median(commits))} ms "
        f"max={ms(max(commits))} ms"
    )
    realistic, worst = ratios[1000, "1 of 10 members"], ratios[1000, "1 group of every job"]
    base = ratios[1000, "untracked (baseline)"]
    print(
        f"the tracker's own share at 1,000 jobs: {realistic - base:.1f} commits' worth "
        f"(removal with tracking {realistic:.1f}, without {base:.1f})"
    )
    print(
        f"ratio median removal / median commit at 1,000 jobs: {realistic:.1f} commits' worth "
        f"(worst case {worst:.1f}); goal <= {GOAL:.0f}: {'met' if realistic <= GOAL else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
