"""Fixtures of the Redis tier's tests: a real redis-server per test (a Unix socket in a
temp directory, a loopback port where a test needs TCP), and real fcache-server processes
(tests/service/support.Launcher)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis.support import RedisServer
from tests.service.support import Launcher, StartServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start fcache-servers for one test: `start_server("--redis", url, name="a")`."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.stop_all()
