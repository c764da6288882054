"""Fixtures that run the real fcache-server as a separate process (see support.Launcher).

`start_server(*flags)` starts servers for one test; `shared_server` is one plain server
for a whole module, whose tests use keys of their own. Every server is stopped (SIGTERM,
then SIGKILL) when its fixture ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.support import Launcher, ServerProcess, StartServer


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start servers for one test: `start_server("--max-bytes", "1M")`."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One plain server (no tokens, no upstream) for a whole test module; tests that share
    it use keys of their own."""
    launcher = Launcher(tmp_path_factory.mktemp("shared"))
    yield launcher()
    launcher.stop_all()
