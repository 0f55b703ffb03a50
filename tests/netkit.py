"""Test hosts: network namespaces of the test's own, each joined to this host by a veth pair,
and the faults a link can have (cut, one-way cut, loss, delay, a lost answer).

Services (a private PostgreSQL, a private Redis) listen on a service address of this host
(``Network.service``, on ``lo``), which every test host reaches over its own veth: a rule in a
host's namespace (nftables) then cuts that host, and only that host, from one service. Delay
and "the answer to this COMMIT never arrives" need a hand on the bytes (this kernel has no
netem: ``CONFIG_NET_SCH_NETEM`` is not set), so each host's PostgreSQL traffic goes through a
relay of its own (``tests.linkrelay``), to which an nftables DNAT rule in the host sends it.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables); ``available()`` says why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.clusterkit import LANE
from tests.linkrelay import LinkRelay


def available() -> str:
    """Empty when test hosts can be made here; else why not (a skip's reason)."""
    if os.geteuid() != 0:
        return "test hosts need root (ip netns, nftables)"
    for tool in ("ip", "nft"):
        if not shutil.which(tool):
            return f"test hosts need `{tool}` (apt-get install iproute2 nftables)"
    probe = f"keel-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    try:  # the rules the faults use: filter chains, and NAT to a relay
        nft(
            "add table inet p\nadd chain inet p o { type filter hook output priority 0; }\n"
            "add rule inet p o numgen random mod 100 < 1 drop\n"
            "add table ip n\nadd chain ip n o { type nat hook output priority -100; }\n",
            probe,
        )
    except subprocess.CalledProcessError as exc:
        return f"nftables cannot filter or NAT in a namespace here: {exc.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def sh(*argv: str, netns: str = "", check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def nft(script: str, netns: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"],
        input=script,
        text=True,
        check=True,
        capture_output=True,
        timeout=20,
    )


@dataclass
class Host:
    """One test host: its namespace, its address, and this host's end of its link."""

    name: str  # the namespace's
    index: int
    address: str  # its own
    gateway: str  # this host's end of its veth
    relayed: dict[int, int] = field(default_factory=dict)  # service port: relay port

    def ports(self, service_port: int) -> str:
        """An nftables set of the ports a service's packets carry on this host's link: its
        own, and its relay's when it is relayed (DNAT turns one into the other)."""
        ports = {service_port, self.relayed.get(service_port, service_port)}
        return "{ " + ", ".join(str(p) for p in sorted(ports)) + " }"

    def rules(self, *lines: str) -> None:
        """Replace this host's fault rules with ``lines`` (each ``output ...`` or ``input
        ...``); none heals the link."""
        script = ["flush chain inet keel output", "flush chain inet keel input"]
        script += [f"add rule inet keel {line}" for line in lines]
        nft("\n".join(script) + "\n", self.name)

    def cut(self, *ports: int) -> None:
        """Nothing passes between this host and the services on ``ports``, either way, on
        connections old or new: a partition (packets vanish; no reset tells anyone)."""
        lines = []
        for port in ports:
            lines += [f"output tcp dport {self.ports(port)} drop"]
            lines += [f"input tcp sport {self.ports(port)} drop"]
        self.rules(*lines)

    def drop_answers(self, *ports: int) -> None:
        """Asymmetric: what the services on ``ports`` send to this host is lost; what it
        sends them arrives."""
        self.rules(*[f"input tcp sport {self.ports(port)} drop" for port in ports])

    def lose(self, percent: int, *ports: int) -> None:
        """Each packet to or from the services on ``ports`` is lost with ``percent``%
        chance."""
        lines = []
        for port in ports:
            lines += [f"output tcp dport {self.ports(port)} numgen random mod 100 < {percent} drop"]
            lines += [f"input tcp sport {self.ports(port)} numgen random mod 100 < {percent} drop"]
        self.rules(*lines)

    def heal(self) -> None:
        self.rules()


class Network:
    """The service address and the test hosts of one test (of this test lane: names and
    subnets carry the lane, so lanes side by side never meet)."""

    def __init__(self, hosts: int) -> None:
        self.prefix = f"kp{LANE}"
        self.net = f"10.{230 + LANE}"
        self.service = f"{self.net}.0.1"
        self.hosts = [
            Host(f"{self.prefix}h{i}", i, f"{self.net}.{i}.2", f"{self.net}.{i}.1")
            for i in range(1, hosts + 1)
        ]
        self.relay: LinkRelay | None = None
        self._lock: int | None = None

    def __enter__(self) -> Network:
        # One network per lane at a time (a benchmark and a test run both use lane 0's names):
        # the second would tear the first's down.
        lock = Path(tempfile.gettempdir()) / f"keel-netkit-{LANE}.lock"
        self._lock = os.open(lock, os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise AssertionError(f"another run is using lane {LANE}'s test hosts") from None
        try:
            self.tear_down()  # what a killed run of this lane left
            sh("ip", "addr", "add", f"{self.service}/32", "dev", "lo")
            for host in self.hosts:
                self._make(host)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.relay is not None:
                self.relay.close()
        finally:
            self.tear_down()
            if self._lock is not None:
                os.close(self._lock)  # and its lock with it
                self._lock = None

    def _make(self, host: Host) -> None:
        outer, inner = host.name, f"{host.name}x"
        sh("ip", "netns", "add", host.name)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", host.name)
        sh("ip", "addr", "add", f"{host.gateway}/24", "dev", outer)
        sh("ip", "link", "set", outer, "up")
        for argv in (
            ("ip", "link", "set", "lo", "up"),
            ("ip", "link", "set", inner, "name", "eth0"),
            ("ip", "addr", "add", f"{host.address}/24", "dev", "eth0"),
            ("ip", "link", "set", "eth0", "up"),
            ("ip", "route", "add", "default", "via", host.gateway),
        ):
            sh(*argv, netns=host.name)
        nft(
            "add table inet keel\n"
            "add chain inet keel output { type filter hook output priority 0; }\n"
            "add chain inet keel input { type filter hook input priority 0; }\n"
            "add table ip keelnat\n"
            "add chain ip keelnat output { type nat hook output priority -100; }\n",
            host.name,
        )

    def relay_through(self, ports: Iterable[int]) -> LinkRelay:
        """Send every host's connections to the services on ``ports`` through a relay of
        this test (its own listening port per host and service), before anything connects:
        NAT decides a connection's path when it opens."""
        self.relay = LinkRelay(self.service)
        for host in self.hosts:
            for port in ports:
                host.relayed[port] = self.relay.listen(host.name, host.gateway, port)
                nft(
                    f"add rule ip keelnat output ip daddr {self.service} tcp dport {port}"
                    f" dnat to {host.gateway}:{host.relayed[port]}\n",
                    host.name,
                )
        self.relay.on_cut = lambda name: self.host(name).cut(*self.relay.ports_of(name))
        return self.relay

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def tear_down(self) -> None:
        for i in range(1, len(self.hosts) + 1):
            sh("ip", "netns", "del", f"{self.prefix}h{i}", check=False)
            sh("ip", "link", "del", f"{self.prefix}h{i}", check=False)
        sh("ip", "addr", "del", f"{self.service}/32", "dev", "lo", check=False)


@contextlib.contextmanager
def healed_after(host: Host) -> Iterator[Host]:
    """The fault set inside is healed on the way out, whatever happens."""
    try:
        yield host
    finally:
        host.heal()
