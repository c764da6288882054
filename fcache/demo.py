"""`fcache demo`: what fcache is for, on the built-in Llama-style model, in a few minutes.

Every run is a new Python process (`python -m fcache.examples.run`), so "warm" means what
it means for a user: a new process finding a cache, with nothing in memory. The rows:

    fcache  cold     empty caches; compiles every unique region once, and puts each on a
                     local fcache-server (started by the demo) as well as on disk
    fcache  warm     a second run on this machine: the regions come from the disk cache
    fcache  shared   another rank, container or node: an empty local cache, the same
                     server; the regions come from the server
    torch.compile    cold and warm (its own caches), for comparison

then a one-line verdict. The demo keeps its caches in one directory (DemoConfig.directory,
default ~/.cache/fcache-demo, emptied at the start of each demo) and ends by printing the
FCACHE_DIR to give `fcache stats` and `fcache ls` to look at what it stored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fcache.errors import FcacheError

MARKER = ".fcache-demo"  # only a directory holding this file is ever emptied


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fcache-demo"


@dataclass(frozen=True)
class DemoConfig:
    layers: tuple[int, ...] = (2,)
    family: str = "llama"
    dim: int = 64
    heads: int = 4
    batch: int = 2
    seq: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    torch_compile: bool = True
    executors: str | None = None
    directory: Path = field(default_factory=default_directory)


LEGEND = """\
How to read it: each row is a fresh process running one training step (forward + backward).
  cold     empty caches: everything is compiled (what every rank of a new job pays today)
  warm     the same machine again: fcache loads its regions from its disk cache
  shared   another rank or node: empty local cache, regions from the node's fcache-server
  start    from the fcache.jit / torch.compile call to the end of the first step
  compiles fcache: regions compiled; torch.compile: graphs compiled
  unique   distinct regions fcache found (identical layers share theirs)
"""


def run_one(system: str, layers: int, cfg: DemoConfig, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process; its JSON report, or {"error": ...} if it failed."""
    cmd = [
        sys.executable, "-m", "fcache.examples.run", "--system", system,
        "--layers", str(layers), "--family", cfg.family, "--dim", str(cfg.dim),
        "--heads", str(cfg.heads), "--batch", str(cfg.batch), "--seq", str(cfg.seq),
        "--device", cfg.device, "--dtype", cfg.dtype, "--check",
    ]  # fmt: skip
    if cfg.executors and system == "fcache":
        cmd += ["--executors", cfg.executors]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}"}
    return dict(json.loads(lines[-1]))


def run_demo(cfg: DemoConfig, out: TextIO = sys.stdout) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    root = _fresh(cfg.directory)
    out.write(_title(cfg))
    out.write(LEGEND + "\n")
    out.write(_header())
    with _server(root) as address:
        for layers in cfg.layers:
            rows += _fcache_rows(cfg, layers, root, address, out)
            if cfg.torch_compile:
                rows += _torch_compile_rows(cfg, layers, root, out)
    out.write("\n" + verdict(rows) + "\n")
    out.write(_where(root, cfg.layers))
    return rows


def _fcache_rows(
    cfg: DemoConfig, layers: int, root: Path, address: str | None, out: TextIO
) -> list[dict[str, Any]]:
    rows = []
    here = _env(root / f"fcache-{layers}", root / f"inductor-{layers}", address)
    # Each fcache process gets an Inductor cache of its own, empty: what is reused is fcache's.
    plan = [("cold", here), ("warm", {**here, "TORCHINDUCTOR_CACHE_DIR": f"{root}/ind-w{layers}"})]
    if address is not None:
        plan.append(
            ("shared", _env(root / f"other-node-{layers}", root / f"ind-s{layers}", address))
        )
    for cache, env in plan:
        rows.append(_row("fcache", layers, cache, cfg, env, out))
    return rows


def _torch_compile_rows(
    cfg: DemoConfig, layers: int, root: Path, out: TextIO
) -> list[dict[str, Any]]:
    env = _env(root / "unused", root / f"torch-compile-{layers}", None)
    return [_row("torch.compile", layers, cache, cfg, env, out) for cache in ("cold", "warm")]


def _row(
    system: str, layers: int, cache: str, cfg: DemoConfig, env: dict[str, str], out: TextIO
) -> dict[str, Any]:
    row = {"system": system, "layers": layers, "cache": cache}
    row.update(run_one(system, layers, cfg, env))
    out.write(_format(row))
    out.flush()
    return row


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """One line: what the warm and shared processes compiled, and what they took."""
    if any("error" in r for r in rows):
        failed = [f"{r['system']} {r['cache']}" for r in rows if "error" in r]
        return f"Verdict: the demo did not finish ({', '.join(failed)} failed)."
    by = {(r["system"], r["cache"], r["layers"]): r for r in rows}
    layers = max(r["layers"] for r in rows)
    cold, warm = by.get(("fcache", "cold", layers)), by.get(("fcache", "warm", layers))
    if cold is None or warm is None:
        return "Verdict: no fcache rows."
    text = (
        f"Verdict: at {layers} layers fcache compiled {cold['compiles']} regions once "
        f"({cold['start_s']:.1f} s); a new process on this machine compiled "
        f"{warm['compiles']} ({warm['start_s']:.1f} s)"
    )
    if shared := by.get(("fcache", "shared", layers)):
        text += (
            f", and one with an empty cache sharing the server compiled {shared['compiles']} "
            f"({shared['start_s']:.1f} s)"
        )
    tc_cold, tc_warm = (
        by.get(("torch.compile", "cold", layers)),
        by.get(("torch.compile", "warm", layers)),
    )
    if tc_cold and tc_warm:
        text += (
            f". torch.compile: {tc_cold['start_s']:.1f} s cold, "
            f"{tc_warm['start_s']:.1f} s warm on the machine that compiled"
        )
    return text + "."


@contextmanager
def _server(root: Path) -> Iterator[str | None]:
    """A local fcache-server for the shared rows (None, and no shared rows, if it fails)."""
    ready = root / "server" / "ready.json"
    ready.parent.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "service.main", "--db", str(root / "server" / "db"),
         "--listen", f"unix:{root / 'server' / 'fcache.sock'}", "--ready-file", str(ready),
         "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        yield json.loads(ready.read_text())["addresses"][0] if ready.exists() else None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def _fresh(directory: Path) -> Path:
    """The demo's directory, emptied; refuses one the demo did not make."""
    if directory.exists() and any(directory.iterdir()) and not (directory / MARKER).exists():
        raise FcacheError(f"{directory} exists and is not the demo's: pass another --dir")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    (directory / MARKER).write_text("made by `fcache demo`; emptied by the next one\n")
    return directory


def _env(cache: Path, inductor: Path, server: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FCACHE_DIR", "FCACHE_SERVER")}
    env["FCACHE_DIR"] = os.fspath(cache)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.fspath(inductor)
    env.setdefault("FCACHE_PROGRESS", "0")  # the table is the progress
    if server is not None:
        env["FCACHE_SERVER"] = server
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    return env


def _where(root: Path, layers: Sequence[int]) -> str:
    cache = root / f"fcache-{layers[-1]}"
    return (
        f"\nThe demo's cache stays in {cache}. Look at it with:\n"
        f"  FCACHE_DIR={cache} fcache stats\n"
        f"  FCACHE_DIR={cache} fcache ls\n"
    )


def _title(cfg: DemoConfig) -> str:
    return (
        f"fcache demo: {cfg.family}-style decoder, d={cfg.dim}, {cfg.heads} heads, "
        f"batch {cfg.batch}x{cfg.seq} tokens, {cfg.dtype} on {cfg.device}\n\n"
    )


_COLUMNS = ("layers", "system", "cache", "start", "steady step", "compiles", "unique",
            "max |err|")  # fmt: skip
_WIDTHS = (6, 14, 6, 11, 12, 9, 7, 0)


def _header() -> str:
    line = "  ".join(c.ljust(w) if w else c for c, w in zip(_COLUMNS, _WIDTHS, strict=True))
    return line + "\n" + "-" * len(line) + "\n"


def _format(row: dict[str, Any]) -> str:
    err = row.get("max_abs_error")
    cells: Sequence[str] = (
        str(row["layers"]),
        row["system"],
        row["cache"],
        f"{row['start_s']:.2f} s" if "start_s" in row else "-",
        f"{row['steady_step_s'] * 1e3:.1f} ms" if row.get("steady_step_s") else "-",
        str(row.get("compiles", "-")),
        str(row.get("unique_regions", "-")),
        row.get("error") or (f"{err:.1e}" if err is not None else ""),
    )
    return "  ".join(c.ljust(w) if w else c for c, w in zip(cells, _WIDTHS, strict=True)) + "\n"
