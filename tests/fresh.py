"""A script run in a fresh Python process (a warm start is a new process), its report
the JSON object on the last line it prints. The repository and the caller's own
PYTHONPATH come first on its path; `env` adds variables (cache directories, settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_json(script: str, timeout: float = 600, **env: str) -> dict[str, Any]:
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report
