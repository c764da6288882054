"""The real fcache-server for the distributed tests (tests/service/support.Launcher)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.support import Launcher, StartServer


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start servers for one test: `start_server("--signing-key-file", path)`."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.stop_all()
