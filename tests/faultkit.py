"""Private services a fault test may stop and start (never the machine's shared ones)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile

import redis

from tests.clusterkit import free_port, wait_for


class PrivateRedis:
    """A redis-server of the test's own on a free port, without persistence: stopping it loses
    whatever was queued, as a crashed broker would."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="keel-redis-")
        self.proc: subprocess.Popen | None = None

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
        except (redis.RedisError, OSError):
            return False

    def start(self) -> PrivateRedis:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed"
        flags = ["--bind", "127.0.0.1", "--port", str(self.port)]
        flags += ["--save", "", "--appendonly", "no", "--dir", self.dir]
        self.proc = subprocess.Popen(
            [server, *flags],
            stdout=subprocess.DEVNULL,
        )
        wait_for(self.answers, 10, what=f"a private Redis on port {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a hung broker)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
