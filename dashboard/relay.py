"""The web process's event relay: one thread tails the event store by ``seq``, woken by the
PostgreSQL notification every appending transaction sends (engine.events), and fans the new
events out through the Channels layer to the groups of the pages they concern. Sockets cost
nothing while nothing happens: no query per tab, only one LISTEN per web process.

Groups: ``events`` (every event, serialized once here), ``cluster`` (every event: the cluster
page shows the feed), ``jobs`` (events of a job, and the dirty-job tracker's cluster-wide ones:
the jobs page re-renders its rows and their recovery labels) and ``job.<id>`` (that job's page).
"""

from __future__ import annotations

import logging
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import close_old_connections, connections

from engine import queries
from engine.api.serializers.events import EngineEventSerializer
from engine.dbsession import connect_dedicated
from engine.events import EVENTS_CHANNEL
from engine.jobs.tasklog_reading import LOGS_CHANNEL, jobs_notified
from engine.jobs.throughput import SAMPLES_CHANNEL

log = logging.getLogger("keel.relay")
#: Without a notification (one lost with a dropped session), look anyway this often; and
#: notice a stop request as soon.
STOP_CHECK = 1.0
#: A job's page redraws for new task log lines at most this often (seconds).
LOGS_FORWARD_INTERVAL = 1.0
BATCH = 500

_started = threading.Lock()
_relay: Relay | None = None


def groups_of(event: dict) -> set[str]:
    groups = {"events", "cluster"}
    if event.get("jobId"):
        groups |= {"jobs", f"job.{event['jobId']}"}
    elif event["kind"].startswith("dirty."):
        # A cluster-wide tracker event (a missed member event, its repair) may change every
        # job's recovery label: the jobs page re-renders its badges.
        groups.add("jobs")
    return groups


class Relay(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="event-relay", daemon=True)
        self.after = queries.latest_seq()
        self.layer = get_channel_layer()
        self.stopping = threading.Event()

    def run(self) -> None:
        delay = 0.5
        # Jobs with new log lines not yet redrawn: kept across a reconnect.
        logged: set[int] = set()
        logs_sent = 0.0
        while not self.stopping.is_set():
            try:
                with connect_dedicated("keel-relay") as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    conn.execute(f"LISTEN {SAMPLES_CHANNEL}")
                    conn.execute(f"LISTEN {LOGS_CHANNEL}")
                    delay = 0.5
                    sampled = False
                    while not self.stopping.is_set():
                        while self.forward():
                            pass
                        if sampled:
                            self.forward_samples()
                        # Every worker ships twice a second: a job's pages redraw for new
                        # lines at most once per LOGS_FORWARD_INTERVAL, whatever the workers.
                        if logged and time.monotonic() - logs_sent >= LOGS_FORWARD_INTERVAL:
                            self.forward_logs(logged)
                            logged, logs_sent = set(), time.monotonic()
                        heard = list(conn.notifies(timeout=STOP_CHECK, stop_after=1))
                        sampled = any(n.channel == SAMPLES_CHANNEL for n in heard)
                        logged |= jobs_notified(
                            n.payload for n in heard if n.channel == LOGS_CHANNEL
                        )
            except Exception as exc:  # the database or the layer blipped: carry on after it
                log.warning("event relay: %s; starting again in %.1f s", exc, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                connections.close_all()

    def forward_samples(self) -> None:
        """New throughput samples: the jobs page and the running jobs' pages redraw (rows/s,
        sparklines); nothing is sent while no job runs."""
        close_old_connections()
        from engine.models import Job
        from engine.states import JobStatus

        running = Job.objects.filter(status=JobStatus.RUNNING).values_list("id", flat=True)
        send = async_to_sync(self.layer.group_send)
        message = {"type": "relay.samples"}
        for group in ["jobs", *(f"job.{job_id}" for job_id in running)]:
            send(group, message)

    def forward_logs(self, jobs: set[int]) -> None:
        """Task groups of these jobs wrote log lines (engine.member.tasklog_shipping): their
        pages redraw, as for new samples."""
        send = async_to_sync(self.layer.group_send)
        for job_id in sorted(jobs):
            send(f"job.{job_id}", {"type": "relay.samples"})

    def forward(self) -> bool:
        """Send the events after ``after`` to their groups; True if a full batch went out."""
        close_old_connections()
        events = EngineEventSerializer(queries.events_after(self.after, BATCH), many=True).data
        if not events:
            return False
        by_group: dict[str, list[dict]] = {}
        for event in events:
            for group in groups_of(event):
                by_group.setdefault(group, []).append(event)
        send = async_to_sync(self.layer.group_send)
        for group, batch in sorted(by_group.items()):
            # ``follows``: the last event this relay sent before the batch (a socket that has
            # not seen it lost a message and reads from the database instead).
            send(
                group,
                {
                    "type": "relay.events",
                    "events": batch,
                    "seq": events[-1]["seq"],
                    "follows": self.after,
                },
            )
        self.after = events[-1]["seq"]
        return len(events) >= BATCH


def ensure_started() -> None:
    """Start this process's relay once (the first socket does)."""
    global _relay
    with _started:
        if _relay is None or not _relay.is_alive():
            _relay = Relay()
            _relay.start()


def stop() -> None:
    """Stop this process's relay and close its sessions (tests, before the database goes)."""
    global _relay
    with _started:
        relay, _relay = _relay, None
    if relay is not None:
        relay.stopping.set()
        relay.join(10)
