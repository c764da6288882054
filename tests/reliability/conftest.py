"""Fixtures of the fault tests: real servers (tests/service/support.Launcher: 127.0.0.1
port 0 and a Unix socket in the test's directory) and a signing key.

Tests marked `soak` (an hour-long soak, a power cut on a loop-mounted image) run only when
asked for with `-m soak`: CI and `make test` skip them, whatever other -m they are given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fcache.cache.signing import Signer
from tests.reliability.support import key_file
from tests.service.support import Launcher, StartServer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "soak" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="a soak test: run it with -m soak")
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(skip)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start servers for one test: `start_server("--max-bytes", "1M")`."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def signing_key(tmp_path: Path) -> Path:
    return key_file(tmp_path)


@pytest.fixture
def signer(signing_key: Path) -> Signer:
    return Signer.from_file(signing_key)
