"""A real redis-server for the Redis tier's tests: started on a Unix socket in a temp
directory (and, when asked, a free loopback port), stopped, killed, paused and restarted
like a real one would be.

redis-server is Debian's package (the Makefile and .ci/run install it when missing); a
machine without it fails these tests saying so, rather than skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tests import fresh
from tests.service.support import ROOT, RawStub, StartServer

START_TIMEOUT_S = 10.0


def free_port(highest: int = 65535) -> int:
    """A loopback port nothing listens on now (redis-server cannot bind port 0 itself), at
    most `highest`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port <= highest:
            return port


class RedisServer:
    """One redis-server process. `url(db)` is what FCACHE_REDIS / --redis take."""

    def __init__(self, *args: str, tcp: bool = False, cluster: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: apt-get install redis-server (make test and "
                ".ci/run install it)"
            )
        self.binary = binary
        # AF_UNIX paths are short; pytest's temp paths under xdist can be long.
        self.dir = Path(tempfile.mkdtemp(prefix="fcache-redis-"))
        self.socket = self.dir / "redis.sock"
        # A cluster node's port must leave room for its bus port (+10000) below 65536.
        self.port = free_port(55535) if cluster else free_port() if tcp else 0
        self.bus_port = free_port() if cluster else 0
        self.cluster = cluster
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            self.close()  # no process or directory left behind by a failed start
            raise

    def url(self, db: int = 0) -> str:
        if self.cluster:
            return f"redis+cluster://127.0.0.1:{self.port}"
        return f"unix://{self.socket}?db={db}"

    def tcp_url(self, db: int = 0) -> str:
        assert self.port, "started without a TCP port"
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        if self.cluster:
            return redis.Redis(host="127.0.0.1", port=self.port)
        return redis.Redis(unix_socket_path=str(self.socket), db=db)

    def start(self) -> None:
        """Start (again, after stop or kill) on the same socket and port, with no data:
        persistence is off, as a cache's Redis may well run."""
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            *(("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
               "--cluster-port", str(self.bus_port)) if self.cluster else ()),
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if self.client().ping():
                    break
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.log()}")
            time.sleep(0.02)
        if self.cluster:
            # One node serving every slot: a Redis Cluster in one process.
            client = self.client()
            if not client.execute_command("CLUSTER", "SLOTS"):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            while client.execute_command("CLUSTER", "INFO").find(b"cluster_state:ok") < 0:
                assert time.monotonic() < deadline, "the cluster did not come up"
                time.sleep(0.05)

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: Redis is gone, with everything it held."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.socket.unlink(missing_ok=True)

    def pause(self) -> None:
        """SIGSTOP: Redis accepts connections but answers nothing (a hung or slow Redis)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a paused one must see the TERM
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- fcache processes and node servers on a Redis --------------------------------------

RUN_TIMEOUT_S = 600


def start(module: str, *args: str) -> Any:
    return fresh.popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: Any) -> dict[str, Any]:
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    assert process.returncode == 0, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def start_node(start_server: StartServer, redis: RedisServer, name: str, *flags: str) -> Any:
    return start_server("--redis", redis.url(), *flags, name=name)


def redis_counters(address: str) -> dict[str, float]:
    counters = RawStub(address).stats().counters
    return {k.removeprefix("redis."): v for k, v in counters.items() if k.startswith("redis.")}
