"""What a benchmark ran on: the machine (CPU, cores, memory, GPUs and driver) and the
versions of everything measured (Python, torch, Triton, nvFuser, Thunder, fcache's commit).

Read without starting CUDA in this process: GPUs come from `nvidia-smi` when it exists,
package versions from installed distribution metadata, so the orchestrating process stays
light and the measured processes are the only ones that touch the device.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Distribution names (any that is installed is reported); nvFuser's carry torch's version.
_PACKAGES = ("torch", "triton", "lightning-thunder", "grpcio", "lmdb", "xxhash", "numpy")
_NVFUSER = re.compile(r"^nvfuser", re.IGNORECASE)


def machine() -> dict[str, Any]:
    """CPU model, logical cores, memory, OS, and each GPU's name, memory and driver."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "gpus": _gpus(),
        # Other work on the machine when the run started (1, 5, 15-minute load averages).
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        # False where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as some container
        # images set it): every measured process then compiles torch's sources again, 2-3 s
        # per process on an H100 host, in every system's start.
        "bytecode_written": not os.environ.get("PYTHONDONTWRITEBYTECODE"),
    }
    return info


def versions() -> dict[str, Any]:
    """Python, the installed packages that matter, and fcache's git commit."""
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["nvfuser"] = _nvfuser_version()
    found["fcache_commit"] = _git_commit()
    return found


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _gpus() -> list[dict[str, str]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "index,name,memory.total,driver_version"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keys = query.split(",")
    return [
        dict(zip(keys, (cell.strip() for cell in line.split(",")), strict=False))
        for line in out.splitlines()
        if line.strip()
    ]


def gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return len(_gpus())


def _nvfuser_version() -> str | None:
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if _NVFUSER.match(name):
            return f"{name} {dist.version}"
    return None


def _git_commit() -> str:
    """HEAD (with "-dirty" when the work tree differs); FCACHE_BENCH_COMMIT where there is
    no .git, as on a machine that got a copy of the work tree."""
    if commit := os.environ.get("FCACHE_BENCH_COMMIT"):
        return commit
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return "unknown"
    try:
        head = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")
