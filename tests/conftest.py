import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests import tests.graphs


@pytest.fixture(autouse=True)
def _isolated_inductor_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own Inductor cache dir: no test warms another's compiler
    by accident, and nothing is written to the user's /tmp/torchinductor_* dirs."""
    base = tmp_path_factory.getbasetemp() / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.fspath(base))
