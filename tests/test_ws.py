"""``/ws/events/``: engine events pushed in order to authenticated clients, resumable by seq."""

from __future__ import annotations

import asyncio
import sys

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from dashboard.routing import websocket_urlpatterns
from engine.events import append_event
from engine.models import EngineEvent
from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def append(kind: str, job_id: int | None = None) -> int:
    with transaction.atomic():
        return append_event(EngineEvent(kind=kind, job_id=job_id)).seq


def run(scenario):
    """``asyncio.run`` whose shutdown is bounded: the scenario's own awaits all have timeouts,
    but a task the Channels layer left behind (a Redis read of a closed consumer) can ignore
    its cancellation and would hang the loop's shutdown forever. Such tasks are reported on
    stderr and the loop is closed without them; the scenario's result and errors stand."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(scenario)
    finally:
        leftover = asyncio.all_tasks(loop)
        for task in leftover:
            task.cancel()
        if leftover:
            _done, pending = loop.run_until_complete(asyncio.wait(leftover, timeout=5))
            for task in pending:
                print(f"test_ws: a task ignored its cancellation: {task!r}", file=sys.stderr)
                task.print_stack(file=sys.stderr)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def connect(path: str, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


async def collect(communicator, count: int) -> list[dict]:
    events = []
    while len(events) < count:
        frame = await communicator.receive_json_from(timeout=10)
        assert frame["type"] == "engine.events"
        events += frame["events"]
    return events


async def through_marker(communicator) -> tuple[list[int], int]:
    """The seqs the socket sends from now until a marker event appended now, and the marker's:
    the relay sends in seq order, so a late duplicate or a stray event of anything before the
    marker comes among them. Deterministic, where waiting a while for nothing only catches
    what comes soon enough."""
    marker = await append("test.marker")
    seqs: list[int] = []
    while not seqs or seqs[-1] < marker:
        frame = await communicator.receive_json_from(timeout=10)
        assert frame["type"] == "engine.events"
        seqs += [e["seq"] for e in frame["events"]]
    assert seqs[-1] == marker, seqs
    return seqs[:-1], marker


def test_stream_pushes_new_events_and_resumes_after_a_seq():
    user = role_user("ws", "viewer")

    async def scenario():
        first = await append("test.a")
        communicator = await connect("/ws/events/?after=0", user)
        connected, _ = await communicator.connect()
        assert connected
        assert [e["kind"] for e in await collect(communicator, 1)] == ["test.a"]
        second = await append("test.b")
        third = await append("test.c")
        sent, marker = await through_marker(communicator)
        assert sent == [second, third]  # each once
        await communicator.disconnect()
        # A client that reconnects with the last seq it saw gets only what followed, once.
        again = await connect(f"/ws/events/?after={second}", user)
        assert (await again.connect())[0]
        assert (await through_marker(again))[0] == [third, marker]
        await again.disconnect()
        return first

    assert run(scenario()) > 0


def test_stream_refuses_anonymous_clients():
    async def scenario():
        communicator = await connect("/ws/events/", AnonymousUser())
        connected, code = await communicator.connect()
        assert not connected and code == 4401

    run(scenario())


def test_live_pages_get_fragments_pushed_and_catch_up_after_a_reconnect(engine):
    """``/ws/live/``: a change to a job reaches the jobs page as an out-of-band swap of its
    rows carrying the seq it shows; a page that was away gets the current state at once on
    reconnecting with its last seq, and nothing while nothing happens."""
    user = role_user("watcher", "viewer")
    engine.add_member(slots=4)

    @database_sync_to_async
    def submit() -> int:
        return engine.submit(config="source { FakeSource { } }\nsink { Blackhole { } }").id

    @database_sync_to_async
    def schedule() -> None:
        engine.schedule()

    @database_sync_to_async
    def latest() -> int:
        from engine.queries import latest_seq

        return latest_seq()

    async def fragment(communicator) -> tuple[str, int]:
        html = await communicator.receive_from(timeout=10)
        seq = int(html.split('id="live-seq" data-seq="')[1].split('"')[0])
        return html, seq

    async def fragment_of_marker(communicator) -> list[int]:
        """The seqs of the fragments sent before a marker's, appended now (an event of a job,
        so the jobs page's group gets it; the relay sends in seq order)."""
        marker = await append("test.marker", 10**9)
        before = []
        while (seq := (await fragment(communicator))[1]) != marker:
            before.append(seq)
        return before

    async def scenario():
        start = await latest()
        page = await connect(f"/ws/live/?topic=jobs&after={start}", user)
        assert (await page.connect())[0]
        # Nothing happened, so nothing is sent. The layer hands the page a redraw (what the
        # relay sends when throughput samples arrive) only after its connect; answered at the
        # seq it was given, it proves the connect is over, and the next fragment must then be
        # a marker's: one sent at the connect would come between.
        await get_channel_layer().group_send("jobs", {"type": "relay.samples"})
        assert (await fragment(page))[1] == start
        assert (await fragment_of_marker(page)) == []
        job_id = await submit()
        html, seq = await fragment(page)
        assert f'data-job-id="{job_id}"' in html and 'id="jobs-live" hx-swap-oob="true"' in html
        assert '<span class="badge pending" data-field="jobStatus">PENDING</span>' in html
        await page.disconnect()

        await schedule()  # while the page is away
        again = await connect(f"/ws/live/?topic=jobs&after={seq}", user)
        assert (await again.connect())[0]
        html, caught_up = await fragment(again)
        assert caught_up == await latest() and caught_up > seq
        assert 'data-field="jobStatus">SCHEDULED</span>' in html
        # Applied once, nothing doubled: a late repeat of the catch-up (say from the relay's
        # own message of those events) would come before the marker's fragment.
        assert (await fragment_of_marker(again)) == []
        await again.disconnect()

        detail = await connect(f"/ws/live/?topic=job.{job_id}&after=0", user)
        assert (await detail.connect())[0]
        html, _ = await fragment(detail)
        assert '<div id="job" hx-swap-oob="innerHTML">' in html
        await detail.disconnect()

        refused = await connect("/ws/live/?topic=jobs&after=0", AnonymousUser())
        assert (await refused.connect()) == (False, 4401)
        bad = await connect("/ws/live/?topic=secrets&after=0", user)
        assert (await bad.connect()) == (False, 4400)

    run(scenario())


def test_an_idle_socket_stays_open_past_the_layers_blocking_read():
    """The channel layer waits on Redis in 5 s blocking reads: a socket with nothing to say
    for longer must stay open and still get the next event (redis-py's default 5 s read
    timeout used to end it)."""
    user = role_user("idle", "viewer")

    async def scenario():
        communicator = await connect("/ws/events/?after=0", user)
        assert (await communicator.connect())[0]
        await through_marker(communicator)  # whatever was there before, and a marker
        assert await communicator.receive_nothing(timeout=7, interval=0.5)
        seq = await append("test.after-idle")
        assert [e["seq"] for e in await collect(communicator, 1)] == [seq]
        await communicator.disconnect()

    run(scenario())


def test_a_cluster_wide_tracker_event_reaches_the_jobs_page_at_once(engine):
    """A member event nobody handled leaves a tracked job UNKNOWN; the master's repair of the
    watermark appends a ``dirty.tracker-failed`` event without a job, and the job, submitted
    after that member event, reads CLEAN from then on. The jobs page gets its new badge at
    once, though no event of any job carries it."""
    from django.db import connection

    from engine import dirty
    from engine.queries import latest_seq

    user = role_user("badges", "viewer")
    engine.add_member(slots=4)
    engine.lose(engine.add_member(slots=0))
    with connection.cursor() as cur:  # as if the tracker had never handled that member event
        cur.execute(
            "UPDATE engine_clusterstate SET dirty_handled_sequence = member_event_sequence - 1"
        )
    job = engine.submit(threshold=2)
    assert dirty.job_summary(job)["evaluationStatus"] == "UNKNOWN"

    @database_sync_to_async
    def job_event() -> int:
        with transaction.atomic():
            return append_event(EngineEvent(kind="test.ping", job_id=job.id)).seq

    @database_sync_to_async
    def repair() -> list[EngineEvent]:
        after = latest_seq()
        engine.new_master()
        return list(EngineEvent.objects.filter(seq__gt=after))

    async def scenario() -> float:
        page = await connect(
            f"/ws/live/?topic=jobs&after={await database_sync_to_async(latest_seq)()}", user
        )
        assert (await page.connect())[0]
        # Once a job's event has come through, the socket follows the relay (its catch-up on
        # connecting is behind it): what comes next is the relay's push.
        ping = await job_event()
        assert f'data-seq="{ping}"' in await page.receive_from(timeout=10)
        events = await repair()
        started = asyncio.get_running_loop().time()
        assert [(e.kind, e.job_id) for e in events] == [("dirty.tracker-failed", None)]
        html = await page.receive_from(timeout=5)
        elapsed = asyncio.get_running_loop().time() - started
        assert f'data-seq="{events[-1].seq}"' in html
        row = html.split(f'data-job-id="{job.id}"')[1].split("</tr>")[0]
        assert 'data-field="evaluationStatus">CLEAN</span>' in row, row
        await page.disconnect()
        return elapsed

    print(f"a cluster-wide tracker event reached the jobs page in {run(scenario()):.3f} s")
