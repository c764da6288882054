from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.runner import env_for, run_model


@pytest.fixture(scope="session")
def warm_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A cache dir holding the 3-layer test Llama, compiled cold once per test session,
    and the report of that cold run."""
    base = tmp_path_factory.mktemp("warm-llama")
    # Three layers: the first may differ from the others (AOTAutograd saves other values
    # for it), the second and third share theirs.
    report = run_model(3, env_for(base / "fcache", base / "inductor"))
    return base / "fcache", report
