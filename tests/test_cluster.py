"""The cluster foundation on a real cluster: OS processes, PostgreSQL, Redis, Celery."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid

import pytest

from tests.clusterkit import PYTHON, ROOT, Cluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(db_template):
    """The shipped path: every command through ``./run``, every process a fresh interpreter
    (the other modules' clusters fork theirs from a set-up one)."""
    with Cluster(
        db_template, masters=2, workers=2, slots=8, heartbeat_timeout=3.0, fresh=True
    ) as c:
        yield c


def test_cluster_up_gives_a_healthy_cluster(healthy):
    """One active master, 2 ALIVE members with their slots, every process up."""
    status = healthy.status()
    assert {p["name"] for p in status} == {"web", "master-1", "master-2", "worker-1", "worker-2"}
    assert all(p["alive"] and p["pid"] for p in status)

    code, overview = healthy.api("/api/v1/overview")
    assert code == 200
    assert overview["activeMaster"]["name"] in {"master-1", "master-2"}
    assert overview["activeMaster"]["epoch"] >= 1
    assert overview["members"]["alive"] == 2
    assert overview["totalSlot"] == 16 and overview["unassignedSlot"] == 16

    code, members = healthy.api("/api/v1/members?state=ALIVE")
    assert code == 200
    assert sorted(m["name"] for m in members) == ["worker-1", "worker-2"]
    assert all(m["slots"] == {"total": 8, "assigned": 0, "free": 8} for m in members)
    # Exactly one master believes it is active.
    active = healthy.query("SELECT name FROM engine_mastercandidate WHERE state = 'ACTIVE'")
    assert len(active) == 1
    # The API token for the local admin is private, and so are the role tokens beside it: a
    # viewer reads, and may not submit.
    for name in ("api-token", "api-token-viewer", "api-token-operator"):
        assert stat.S_IMODE(os.stat(healthy.var_dir / name).st_mode) == 0o600
    viewer = (healthy.var_dir / "api-token-viewer").read_text().strip()
    assert healthy.api("/api/v1/jobs", token=viewer)[0] == 200
    code, body = healthy.post("/api/v1/jobs", {"config": "x"}, token=viewer)
    assert code == 403 and "operator" in body["detail"]


def test_kill_active_master_elects_a_new_one_within_one_second(healthy):
    """Kill -9 of the active master: a new active master, higher epoch, < 1 s."""
    epoch, holder = healthy.active_master()
    pid = healthy.signal(holder, signal.SIGKILL)
    killed_at = time.monotonic()

    def new_master():
        current = healthy.active_master()
        return current if current and current[0] > epoch and current[1] != holder else None

    new_epoch, _ = wait_for(new_master, 5, interval=0.005, what="a new active master")
    elapsed = time.monotonic() - killed_at
    assert elapsed < 1.0, f"election took {elapsed:.3f}s"
    assert new_epoch == epoch + 1
    wait_for(lambda: not healthy.alive(holder), 5, what=f"{holder} (pid {pid}) to be gone")
    kinds = healthy.query(
        "SELECT kind, epoch FROM engine_engineevent WHERE kind = 'master.elected' AND epoch = %s",
        (new_epoch,),
    )
    assert kinds == [("master.elected", new_epoch)]


def test_frozen_master_is_replaced_and_fenced_when_it_resumes(healthy):
    """SIGSTOP past the lease: a standby takes over; after SIGCONT the old
    master's write is rejected by the epoch check and it steps down."""
    epoch, holder = healthy.active_master()
    rejections_before = healthy.one(
        "SELECT fenced_rejections FROM engine_mastercandidate WHERE name = %s", (holder,)
    )
    healthy.signal(holder, signal.SIGSTOP)
    try:
        new_epoch, new_holder = wait_for(
            lambda: (m := healthy.active_master()) and m[0] > epoch and m,
            15,
            what="a standby to take over from the frozen master",
        )
        assert new_holder != holder
    finally:
        healthy.signal(holder, signal.SIGCONT)

    # It wakes, tries to write under its old epoch, is rejected, and steps down.
    wait_for(
        lambda: healthy.one(
            "SELECT fenced_rejections > %s AND state = 'STANDBY' AND last_rejected_epoch = %s "
            "FROM engine_mastercandidate WHERE name = %s",
            (rejections_before, epoch, holder),
        ),
        10,
        what="the resumed master to record its rejected write and stand by",
    )
    assert "write rejected by the epoch check" in healthy.log(holder)
    # Nothing was written under the old epoch after the new one began.
    elected_seq = healthy.one(
        "SELECT seq FROM engine_engineevent WHERE kind = 'master.elected' AND epoch = %s",
        (new_epoch,),
    )
    late = healthy.one(
        "SELECT count(*) FROM engine_engineevent WHERE epoch = %s AND seq > %s",
        (epoch, elected_seq),
    )
    assert late == 0
    # The new master keeps leading; the old one is alive as a standby.
    assert healthy.active_master() == (new_epoch, new_holder)
    assert healthy.alive(holder)


def test_kill_worker_is_removed_within_one_second_and_restarts_as_new_member(healthy):
    """Kill -9 of a worker: REMOVED within 1 s, member-event sequence +1 exactly;
    ``./run cluster start worker-1`` registers a new UUID."""
    old_uuid = healthy.one(
        "SELECT uuid FROM engine_member WHERE name = 'worker-1' AND state = 'ALIVE'"
    )
    sequence = healthy.member_event_sequence()
    healthy.run("cluster", "kill", "worker-1")  # the user's command: SIGKILL
    killed_at = time.monotonic()
    wait_for(
        lambda: (
            healthy.one("SELECT state FROM engine_member WHERE uuid = %s", (old_uuid,)) == "REMOVED"
        ),
        5,
        interval=0.005,
        what="the killed worker to be REMOVED",
    )
    # `cluster kill` returns once the process is gone, so the detection took at most this long.
    assert time.monotonic() - killed_at < 1.0
    assert healthy.member_event_sequence() == sequence + 1
    removed = healthy.query(
        "SELECT e.payload->>'memberEventSequence' FROM engine_engineevent e "
        "JOIN engine_member m ON m.id = e.member_id "
        "WHERE m.uuid = %s AND e.kind = 'member.removed'",
        (old_uuid,),
    )
    assert removed == [(str(sequence + 1),)]

    # A name the cluster does not have: the command says so and starts nothing, not even
    # the names it has (their processes would start before Django is set up otherwise).
    proc = healthy.run("cluster", "start", "worker-1", "worker-9", check=False)
    assert proc.returncode != 0 and "no process named 'worker-9'" in proc.stderr
    assert not healthy.alive("worker-1")
    healthy.start("worker-1")
    new_uuid = healthy.one(
        "SELECT uuid FROM engine_member WHERE name = 'worker-1' AND state = 'ALIVE'"
    )
    assert new_uuid is not None and new_uuid != old_uuid
    assert healthy.one("SELECT state FROM engine_member WHERE uuid = %s", (old_uuid,)) == "REMOVED"


def test_member_event_sequence_rises_once_with_masters_racing(healthy):
    """A dead member seen at once by the active master and by racing processes
    that attempt the same removal (two with the current epoch, as duplicate deliveries; two
    with a stale epoch, as a deposed master) is removed once; the sequence rises by one."""
    sequence = healthy.member_event_sequence()
    epoch, _ = healthy.active_master()
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    # Each racer polls for the ghost every millisecond and removes it the moment it exists.
    script = (
        "import django, sys, time; django.setup()\n"
        "from engine.models import Member\n"
        "from engine.cluster.membership import remove_member\n"
        "from engine.fencing import StaleEpoch\n"
        "print('ready', flush=True)\n"
        "deadline = time.monotonic() + 30\n"
        "while time.monotonic() < deadline:\n"
        "    ids = list(Member.objects.filter(name=sys.argv[2]).values_list('id', flat=True))\n"
        "    if ids: break\n"
        "    time.sleep(0.001)\n"
        "try:\n"
        "    print(remove_member(int(sys.argv[1]), ids[0], 'race'))\n"
        "except StaleEpoch:\n"
        "    print('stale')\n"
    )
    env = dict(healthy.env, DJANGO_SETTINGS_MODULE="keel.settings")
    racers = [
        subprocess.Popen(
            [PYTHON, "-c", script, str(e), ghost],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for e in (epoch, epoch, epoch - 1, epoch - 1)
    ]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready"
    # No session holds the ghost's lock, so the active master removes it on its next sweep too.
    member_id = healthy.one(
        """
        INSERT INTO engine_member (uuid, name, address, host, pid, state, slot_mode, slot_count,
                                   protocol_version, started_at, last_heartbeat, end_reason)
        VALUES (%s, %s, 'nowhere:0', 'nowhere', 0, 'ALIVE', 'FIXED', 0, 1, now(), now(), '')
        RETURNING id
        """,
        (uuid.uuid4(), ghost),
    )
    outputs = [r.communicate(timeout=60) for r in racers]
    assert all(r.returncode == 0 for r in racers), outputs
    results = [out.strip() for out, _ in outputs]
    assert results[2:] == ["stale", "stale"]
    assert set(results[:2]) <= {"True", "False"}
    wait_for(
        lambda: (
            healthy.one("SELECT state FROM engine_member WHERE id = %s", (member_id,)) == "REMOVED"
        ),
        5,
        what="the ghost to be REMOVED",
    )
    winners = results[:2].count("True")
    by_master = healthy.one(
        "SELECT payload->>'reason' <> 'race' FROM engine_engineevent "
        "WHERE member_id = %s AND kind = 'member.removed'",
        (member_id,),
    )
    assert winners + int(by_master) == 1
    assert healthy.member_event_sequence() == sequence + 1
    assert (
        healthy.one(
            "SELECT count(*) FROM engine_engineevent "
            "WHERE member_id = %s AND kind = 'member.removed'",
            (member_id,),
        )
        == 1
    )


def test_frozen_worker_never_comes_back_under_its_old_uuid(healthy):
    """SIGSTOP of a worker past the heartbeat timeout, then SIGCONT: it is
    REMOVED, learns it is gone and exits; its UUID is never ALIVE again."""
    old_uuid = healthy.one(
        "SELECT uuid FROM engine_member WHERE name = 'worker-2' AND state = 'ALIVE'"
    )
    pid = healthy.signal("worker-2", signal.SIGSTOP)
    try:
        wait_for(
            lambda: healthy.one(
                "SELECT state = 'REMOVED' AND end_reason = 'heartbeat timeout' "
                "FROM engine_member WHERE uuid = %s",
                (old_uuid,),
            ),
            healthy.heartbeat_timeout + 5,
            what="the frozen worker to be REMOVED by heartbeat timeout",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not healthy.alive("worker-2"), 10, what="the fenced worker to exit")
    row = healthy.db.execute(
        "SELECT state, last_heartbeat <= ended_at FROM engine_member WHERE uuid = %s", (old_uuid,)
    ).fetchone()
    assert row == ("REMOVED", True)
    assert "no longer ALIVE" in healthy.log("worker-2") or "session lost" in healthy.log("worker-2")
    healthy.start("worker-2")
    assert (
        healthy.one(
            "SELECT count(*) FROM engine_member WHERE name = 'worker-2' AND state = 'ALIVE' "
            "AND uuid <> %s",
            (old_uuid,),
        )
        == 1
    )


def test_sigterm_worker_leaves_and_sigterm_master_hands_over(healthy):
    """Graceful stops: a worker is LEFT at once; the active master hands over at once."""
    sequence = healthy.member_event_sequence()
    member_uuid = healthy.one(
        "SELECT uuid FROM engine_member WHERE name = 'worker-1' AND state = 'ALIVE'"
    )
    healthy.run("cluster", "stop", "worker-1")
    assert healthy.one("SELECT state FROM engine_member WHERE uuid = %s", (member_uuid,)) == "LEFT"
    assert healthy.member_event_sequence() == sequence + 1

    epoch, holder = healthy.active_master()
    healthy.signal(holder, signal.SIGTERM)
    stopped_at = time.monotonic()
    wait_for(
        lambda: (m := healthy.active_master()) and m[0] > epoch and m[1] != holder,
        5,
        interval=0.005,
        what="the standby to take over after SIGTERM",
    )
    assert time.monotonic() - stopped_at < 1.0
    assert (
        healthy.one(
            "SELECT count(*) FROM engine_engineevent WHERE kind = 'master.resigned' AND epoch = %s",
            (epoch,),
        )
        == 1
    )


def test_member_queue_reaches_that_members_celery_worker(healthy):
    """Commands travel over Celery on ``member.<name>`` to that member, and only that one."""
    script = (
        "import django, json, sys; django.setup()\n"
        "from engine.member.handlers import member_ping\n"
        "from engine.protocol import member_queue\n"
        "r = member_ping.apply_async(args=[sys.argv[1]], queue=member_queue(sys.argv[1]))\n"
        "print(json.dumps(r.get(timeout=20)))\n"
    )
    env = dict(healthy.env, DJANGO_SETTINGS_MODULE="keel.settings")
    for name in ("worker-1", "worker-2"):
        out = subprocess.run(
            [PYTHON, "-c", script, name],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        expected = healthy.one(
            "SELECT uuid::text FROM engine_member WHERE name = %s AND state = 'ALIVE'", (name,)
        )
        assert f'"memberUuid": "{expected}"' in out and '"ok": true' in out


def test_api_requires_authentication_on_a_live_cluster(healthy):
    """Every /api/v1/ endpoint answers 401 without credentials."""
    for path in ("/api/v1/overview", "/api/v1/members", "/api/v1/events", "/api/v1/schema"):
        code, _ = healthy.api(path, anonymous=True)
        assert code == 401, path
        code, _ = healthy.api(path, token="not-a-token")
        assert code == 401, path
    code, body = healthy.api("/healthz", anonymous=True)
    assert code == 200 and body["status"] == "ok"


def test_status_reports_dead_processes(healthy):
    healthy.signal("master-2", signal.SIGKILL)
    wait_for(lambda: not healthy.alive("master-2"), 5, what="master-2 to die")
    status = {p["name"]: p for p in healthy.status()}
    assert status["master-2"]["alive"] is False
    assert status["web"]["alive"] is True
    proc = healthy.run("cluster", "kill", "master-2", check=False)
    assert proc.returncode != 0 and "not running" in proc.stderr
    assert "Traceback" not in proc.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


#: What an engine process must never load: the web stack (engine.process).
WEB_ONLY = (
    "daphne",
    "twisted",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "axes",
    "django.contrib.admin",
    "autobahn",
)


def _imported(import_log: str) -> set[str]:
    """The modules named in a ``-X importtime`` log."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in import_log.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_masters_and_workers_load_no_web_stack_and_the_web_sets_up_once(healthy, tmp_path):
    """A master and a worker started as an operator starts them run without daphne, twisted
    or any other web-only app, also once the worker's Celery consumer has served a command;
    the web process is ``manage.py web`` itself (daphne in-process, not exec'd)."""
    env = dict(healthy.env, PYTHONPROFILEIMPORTTIME="1", PYTHONUNBUFFERED="1")
    probes = {
        "worker": [PYTHON, "manage.py", "worker", "--name", "probe-worker", "--slots", "1"],
        "master": [PYTHON, "manage.py", "master", "--name", "probe-master"],
    }
    logs = {kind: open(tmp_path / f"{kind}.log", "w+") for kind in probes}
    procs = {
        kind: subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=logs[kind], text=True
        )
        for kind, argv in probes.items()
    }
    try:
        wait_for(
            lambda: (
                healthy.one(
                    "SELECT count(*) FROM engine_member"
                    " WHERE name = 'probe-worker' AND state = 'ALIVE'"
                )
                and healthy.one(
                    "SELECT count(*) FROM engine_mastercandidate WHERE name = 'probe-master'"
                )
            ),
            60,
            interval=0.1,
            what="the probe worker ALIVE and the probe master a candidate",
        )
        ping = (
            "import django, json, sys; django.setup()\n"
            "from engine.member.handlers import member_ping\n"
            "from engine.protocol import member_queue\n"
            "r = member_ping.apply_async(\n"
            "    args=['probe-worker'], queue=member_queue('probe-worker'))\n"
            "print(json.dumps(r.get(timeout=20)))\n"
        )
        out = subprocess.run(
            [PYTHON, "-c", ping],
            cwd=ROOT,
            env=dict(healthy.env, DJANGO_SETTINGS_MODULE="keel.settings"),
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert '"ok": true' in out
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for kind, proc in procs.items():
            proc.wait(30)
            logs[kind].close()
    for kind in probes:
        log = (tmp_path / f"{kind}.log").read_text()
        modules = _imported(log)
        assert "engine.member.worker" in modules or "engine.master.loop" in modules, log[-2000:]
        loaded = sorted(
            m for m in modules for web in WEB_ONLY if m == web or m.startswith(web + ".")
        )
        assert not loaded, f"the {kind} imported {loaded[:10]}"
    web_argv = (healthy.var_dir / "cluster" / "web.pid").read_text().split()[0]
    cmdline = open(f"/proc/{web_argv}/cmdline", "rb").read().split(b"\0")
    assert cmdline[1:3] == [str(ROOT / "manage.py").encode(), b"web"], cmdline
