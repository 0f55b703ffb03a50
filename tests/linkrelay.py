"""A relay that carries test hosts' PostgreSQL connections and can hurt them: slow a host's
link (a delay with jitter, in order, as a long link has), or cut it right after the host sent
a COMMIT, so that the statement runs and its answer never arrives.

One asyncio loop in a thread of the test. Each (host, service port) has a listening port on
this host's end of the host's veth; the host's nftables DNAT rule sends its connections there
(tests.netkit). A cut host's bytes are read and dropped, both ways, with no reset: its peers
learn of it only by their own timeouts, as in a partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

#: The codes of the untyped requests a client may send before its startup message.
SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102
#: How much of a statement's text is read to match it.
HEAD = 300


class Statements:
    """The statements a PostgreSQL client sends, from its side of the stream: the untyped
    start (SSL or GSS requests, then the startup message), then typed messages, of which a
    simple Query ('Q') or a Parse ('P') carries a statement's text."""

    def __init__(self) -> None:
        self.buf = b""
        self.skip = 0
        self.started = False

    def feed(self, data: bytes) -> list[str]:
        found: list[str] = []
        self.buf += data
        while True:
            if self.skip:
                taken = min(self.skip, len(self.buf))
                self.buf, self.skip = self.buf[taken:], self.skip - taken
                if self.skip:
                    return found
            if not self.started:
                if len(self.buf) < 8:
                    return found
                length, code = struct.unpack("!ii", self.buf[:8])
                self.started = code not in (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST)
                self.skip = length
                continue
            if len(self.buf) < 5:
                return found
            kind, length = self.buf[:1], struct.unpack("!i", self.buf[1:5])[0]
            if kind in (b"Q", b"P"):
                if len(self.buf) < min(1 + length, HEAD):
                    return found
                text = self.buf[5 : min(1 + length, HEAD)]
                if kind == b"P":  # a statement's name, then its text
                    text = text.partition(b"\0")[2]
                found.append(text.partition(b"\0")[0].decode(errors="replace"))
            self.skip = 1 + length


@dataclass
class Link:
    """One host's relayed link: how it is hurt now, and its open connections."""

    name: str
    delay: float = 0.0
    jitter: float = 0.0
    cut: bool = False
    #: {service port: statement prefixes}: the first such statement sent cuts the link.
    armed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    fired: threading.Event = field(default_factory=threading.Event)
    fired_by: str = ""
    transports: set = field(default_factory=set)


class LinkRelay:
    def __init__(self, service: str) -> None:
        self.service = service
        self.links: dict[str, Link] = {}
        self.servers: list[asyncio.AbstractServer] = []
        self.ports: dict[str, list[int]] = {}
        #: Called (in the relay's thread) with a host's name when its link is cut by a
        #: statement: the kit then cuts the host's packets too, so nothing new gets through.
        self.on_cut: Callable[[str], None] = lambda name: None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="relay")
        self.thread.start()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def listen(self, name: str, address: str, port: int) -> int:
        """Relay host ``name``'s connections to the service on ``port``; the relay's port."""
        link = self.links.setdefault(name, Link(name))
        self.ports.setdefault(name, []).append(port)

        async def start() -> int:
            server = await asyncio.start_server(
                lambda r, w: self._carry(link, port, r, w), address, 0
            )
            self.servers.append(server)
            return server.sockets[0].getsockname()[1]

        return self._call(start())

    def ports_of(self, name: str) -> list[int]:
        return list(self.ports.get(name, []))

    # -- faults (called from the test's thread) ------------------------------------------------

    def slow(self, name: str, delay: float, jitter: float) -> None:
        link = self.links[name]
        link.delay, link.jitter = delay, jitter

    def cut_after(self, name: str, port: int, *prefixes: str) -> threading.Event:
        """Cut host ``name``'s link right after it sends, to the service on ``port``, a
        statement starting with one of ``prefixes`` (case-insensitive): the statement is
        delivered, nothing after it in either direction. The event is set then."""
        link = self.links[name]
        link.fired.clear()
        link.armed[port] = tuple(p.upper() for p in prefixes)
        return link.fired

    def heal(self, name: str) -> None:
        """The link carries again; connections that were cut are closed (their peers gave
        up on them by now, or will on their next write)."""
        link = self.links[name]
        link.delay = link.jitter = 0.0
        link.armed.clear()

        def close_cut() -> None:
            if link.cut:
                for transport in list(link.transports):
                    transport.abort()
            link.cut = False

        self.loop.call_soon_threadsafe(close_cut)

    def close(self) -> None:
        async def shut_down() -> None:
            # Connections aborted, their pumps end of themselves (a cancelled connection task
            # would make asyncio's server log its CancelledError); any left are cancelled.
            for server in self.servers:
                server.close()
            for link in self.links.values():
                for transport in list(link.transports):
                    transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=5)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(shut_down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()

    # -- the relay (in its loop) ------------------------------------------------------------

    async def _carry(self, link: Link, port: int, client_r, client_w) -> None:
        try:
            server_r, server_w = await asyncio.wait_for(
                asyncio.open_connection(self.service, port), 5
            )
        except (TimeoutError, OSError):
            client_w.transport.abort()
            return
        for w in (client_w, server_w):
            link.transports.add(w.transport)
        try:
            await asyncio.gather(
                self._pump(link, port, client_r, server_w, Statements()),
                self._pump(link, port, server_r, client_w, None),
            )
        finally:
            for w in (client_w, server_w):
                link.transports.discard(w.transport)
                w.transport.abort()

    async def _pump(self, link: Link, port: int, reader, writer, statements) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, writer))
        last = 0.0
        try:
            while data := await reader.read(65536):
                fired = ""
                if statements is not None:
                    sent = statements.feed(data)
                    prefixes = link.armed.get(port, ())
                    fired = next(
                        (s for s in sent if s.lstrip().upper().startswith(prefixes or ("\0",))),
                        "",
                    )
                if link.cut:
                    continue  # lost on the way
                at = self.loop.time() + link.delay + random.uniform(-link.jitter, link.jitter)
                last = max(last, at)
                queue.put_nowait((last, data))
                if fired:
                    link.cut, link.fired_by = True, fired
                    link.armed.clear()
                    await self.loop.run_in_executor(None, self.on_cut, link.name)
                    link.fired.set()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception):
                await sender

    async def _send(self, queue: asyncio.Queue, writer) -> None:
        while True:
            at, data = await queue.get()
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            wait = at - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return
