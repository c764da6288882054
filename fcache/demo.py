"""`fcache demo`: what fcache is for, on the built-in Llama-style model, in a few minutes.

Every run is a new Python process (`python -m fcache.examples.run`), so "warm" means what
it means for a user: a new process finding a cache, with nothing in memory. The rows:

    fcache  cold     empty caches; compiles every unique region once, and puts each on a
                     local fcache-server (started by the demo) as well as on disk
    fcache  warm     a second process on this machine: every region from the disk cache
    fcache  shared   another rank, container or node: an empty local cache, the same
                     server; every region from the server
    torch.compile    cold and warm (its own caches), for comparison

then a one-line verdict. While a row runs, a status line says how long it has run and,
for fcache, how many regions are ready (its progress, read from the child's stderr).

What the columns mean, the same for both systems: start is the `fcache.jit` /
`torch.compile` call to the end of the first training step; the steady step is the median
of STEPS further steps; compiled and loaded say what each system built or found, in its
own unit (fcache: regions; torch.compile: graphs); regions is fcache's region instances
in the model and how many are unique (identical layers share theirs). On a CPU each row's
process computes on one thread (OMP_NUM_THREADS=1, unless set): with one thread per core,
a step waits at every parallel region for a thread another program holds, and on a busy
2-core machine steady steps of 3 ms measured 760 ms (bench/results/cpu-demo-steady-2026-11-27).

The demo keeps its caches in one directory (DemoConfig.directory, default
~/.cache/fcache-demo, emptied at the start of each demo) and ends by printing the
commands that show what it stored, with the path of this installation's `fcache`, so that
they work as printed without an activated virtual environment.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from fcache.cache.signing import load_or_create
from fcache.errors import FcacheError

MARKER = ".fcache-demo"  # only a directory holding this file is ever emptied
STEPS = 20  # steady steps a row times after its first (milliseconds each on the demo model)
TICK_S = 1.0  # how often the status line of a running row is rewritten on a terminal
LINE_EVERY_S = 10.0  # elsewhere (a pipe, a log), how often a status line is written
TIERS = {"local": "disk", "remote": "server"}  # where a region came from, in words


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


LEGEND = f"""\
How to read it: each row is a fresh process running one training step (forward + backward).
  cold     empty caches: everything is compiled (what every rank of a new job pays today)
  warm     a second process on this machine: fcache loads every region from its disk cache
  shared   another rank or node: empty local cache, every region from the node's fcache-server
  start    from the fcache.jit / torch.compile call to the end of the first step
  steady   median of the {STEPS} steps after the first (on a CPU, one thread per process)
  compiled what the process built: fcache regions, torch.compile graphs
  loaded   what it found in a cache instead, and where
  regions  fcache: region instances in the model (unique ones): identical layers share theirs
"""

# (system, cache, elapsed seconds, the child's latest progress line or "")
Status = Callable[[str, str, float, str], None]


def run_one(
    system: str,
    layers: int,
    cfg: DemoConfig,
    env: dict[str, str],
    status: Status | None = None,
    cache: str = "",
) -> dict[str, Any]:
    """One fresh process; its JSON report, or {"error": ...} (with the end of what it
    printed on stderr) if it failed. `status` is called while it runs."""
    cmd = [
        sys.executable, "-m", "fcache.examples.run", "--system", system,
        "--layers", str(layers), "--family", cfg.family, "--dim", str(cfg.dim),
        "--heads", str(cfg.heads), "--batch", str(cfg.batch), "--seq", str(cfg.seq),
        "--device", cfg.device, "--dtype", cfg.dtype, "--steps", str(STEPS), "--check",
    ]  # fmt: skip
    if cfg.executors and system == "fcache":
        cmd += ["--executors", cfg.executors]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    readers = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
    start = time.monotonic()
    while proc.poll() is None:
        if status is not None:
            status(system, cache, time.monotonic() - start, _latest_progress(err))
        with suppress(subprocess.TimeoutExpired):
            proc.wait(TICK_S)
    for reader in readers:
        reader.join()
    lines = "".join(out).strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "".join(err).strip().splitlines()[-3:]
        return {"error": f"exit code {proc.returncode}", "stderr": "\n".join(tail)}
    return dict(json.loads(lines[-1]))


def _drain(stream: IO[str] | None, into: list[str]) -> threading.Thread:
    """Read a pipe to its end on a thread (a full pipe would stop the child)."""

    def read() -> None:
        assert stream is not None
        for chunk in iter(lambda: stream.read(256), ""):
            into.append(chunk)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _latest_progress(err: list[str]) -> str:
    """The child's last complete fcache progress line (a line, or a status rewritten in
    place after a \\r): what follows the last separator may be half written."""
    text = "".join(err[-64:])
    parts = [p.strip() for p in text.replace("\r", "\n").split("\n")[:-1]]
    latest = next((p for p in reversed(parts) if p.startswith("fcache: ")), "")
    return latest.removeprefix("fcache: ")


def run_demo(cfg: DemoConfig, out: TextIO = sys.stdout) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    root = _fresh(cfg.directory)
    out.write(_title(cfg))
    out.write(LEGEND + "\n")
    out.write(_header())
    # The node's one signing key, as the README's set-up hands it to the server and to
    # every rank: a process with a key of its own cannot verify (so never loads) what
    # another signed, and the shared rows would compile everything again.
    key = root / "signing.key"
    load_or_create(key)
    with _server(root, key) as address:
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
    here = _env(cfg, root / f"fcache-{layers}", root / f"inductor-{layers}", address)
    # Each fcache process gets an Inductor cache of its own, empty: what is reused is fcache's.
    plan = [("cold", here), ("warm", {**here, "TORCHINDUCTOR_CACHE_DIR": f"{root}/ind-w{layers}"})]
    if address is not None:
        plan.append(
            ("shared", _env(cfg, root / f"other-node-{layers}", root / f"ind-s{layers}", address))
        )
    for cache, env in plan:
        rows.append(_row("fcache", layers, cache, cfg, env, out))
    return rows


def _torch_compile_rows(
    cfg: DemoConfig, layers: int, root: Path, out: TextIO
) -> list[dict[str, Any]]:
    env = _env(cfg, root / "unused", root / f"torch-compile-{layers}", None)
    return [_row("torch.compile", layers, cache, cfg, env, out) for cache in ("cold", "warm")]


def _row(
    system: str, layers: int, cache: str, cfg: DemoConfig, env: dict[str, str], out: TextIO
) -> dict[str, Any]:
    row = {"system": system, "layers": layers, "cache": cache}
    shown = _StatusLine(out)
    row.update(run_one(system, layers, cfg, env, status=shown, cache=cache))
    shown.clear()
    out.write(_format(row))
    if row.get("stderr"):
        out.write("".join(f"        {line}\n" for line in row["stderr"].splitlines()))
    out.flush()
    return row


class _StatusLine:
    """What a running row shows: on a terminal one line rewritten in place, elsewhere a
    line every LINE_EVERY_S seconds."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = _isatty(out)
        self.width = 0
        self.next_line_s = LINE_EVERY_S

    def __call__(self, system: str, cache: str, elapsed: float, progress: str) -> None:
        doing = progress or (
            "capturing, compiling and running the first step"
            if cache == "cold"
            else "loading and running the first step"
        )
        text = f"  ... {system} {cache}, {elapsed:.0f} s: {doing}"
        if self.tty:
            self.out.write("\r" + text.ljust(self.width))
            self.width = len(text)
        elif elapsed >= self.next_line_s:
            self.next_line_s += LINE_EVERY_S
            self.out.write(text + "\n")
        self.out.flush()

    def clear(self) -> None:
        if self.tty and self.width:
            self.out.write("\r" + " " * self.width + "\r")


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
        f"Verdict: at {layers} layers the model's {cold.get('regions', '?')} regions are "
        f"{cold['unique_regions']} unique ones; fcache compiled {cold['compiles']} "
        f"({cold['start_s']:.1f} s), and a new process on this machine loaded "
        f"{_loaded(warm)[0]} and compiled {warm['compiles']} ({warm['start_s']:.1f} s)"
    )
    if shared := by.get(("fcache", "shared", layers)):
        text += (
            f", as did one with an empty cache sharing the server: {_loaded(shared)[0]} "
            f"loaded, {shared['compiles']} compiled ({shared['start_s']:.1f} s)"
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


def _loaded(row: dict[str, Any]) -> tuple[int, str]:
    """How many regions (fcache) or graphs (torch.compile) came from a cache, and where."""
    if row["system"] != "fcache":
        return int(row.get("graph_cache_hits", 0)), "its cache"
    hits = {t: n for t, n in row.get("hits", {}).items() if t != "memory" and n}
    return sum(hits.values()), "+".join(TIERS.get(t, t) for t in sorted(hits))


@contextmanager
def _server(root: Path, key: Path) -> Iterator[str | None]:
    """A local fcache-server for the shared rows (None, and no shared rows, if it fails)."""
    ready = root / "server" / "ready.json"
    ready.parent.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "service.main", "--db", str(root / "server" / "db"),
         "--listen", f"unix:{root / 'server' / 'fcache.sock'}", "--ready-file", str(ready),
         "--signing-key-file", str(key), "--log-level", "WARNING"],
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


def _env(cfg: DemoConfig, cache: Path, inductor: Path, server: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FCACHE_DIR", "FCACHE_SERVER")}
    env["FCACHE_DIR"] = os.fspath(cache)
    env["FCACHE_SIGNING_KEY_FILE"] = os.fspath(cache.parent / "signing.key")  # run_demo's
    env["TORCHINDUCTOR_CACHE_DIR"] = os.fspath(inductor)
    if cfg.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # why: the module docstring
    if server is not None:
        env["FCACHE_SERVER"] = server
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    return env


def fcache_command() -> str:
    """How to run this installation's `fcache` from the current directory, whether or not
    its virtual environment is active: the script beside this Python, by a relative path
    under the current directory (`.venv/bin/fcache`), else `python -m fcache.cli`."""
    script = Path(sys.executable).parent / "fcache"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m fcache.cli"
    here = Path.cwd()
    if here == Path(here.anchor) or not script.is_relative_to(here):
        return shlex.quote(str(script))
    return shlex.quote(str(script.relative_to(here)))


def _where(root: Path, layers: Sequence[int]) -> str:
    cache = shlex.quote(str(root / f"fcache-{layers[-1]}"))
    fcache = fcache_command()
    return (
        f"\nThe demo's cache stays in {cache}. Look at it with:\n"
        f"  FCACHE_DIR={cache} {fcache} stats\n"
        f"  FCACHE_DIR={cache} {fcache} ls\n"
    )


def _title(cfg: DemoConfig) -> str:
    return (
        f"fcache demo: {cfg.family}-style decoder, d={cfg.dim}, {cfg.heads} heads, "
        f"batch {cfg.batch}x{cfg.seq} tokens, {cfg.dtype} on {cfg.device}\n\n"
    )


_COLUMNS = ("layers", "system", "cache", "start", "steady", "compiled", "loaded",
            "regions", "max |err|")  # fmt: skip
_WIDTHS = (6, 13, 6, 8, 8, 11, 19, 9, 0)


def _header() -> str:
    line = "  ".join(c.ljust(w) if w else c for c, w in zip(_COLUMNS, _WIDTHS, strict=True))
    return line + "\n" + "-" * len(line) + "\n"


def _format(row: dict[str, Any]) -> str:
    err = row.get("max_abs_error")
    unit = "regions" if row["system"] == "fcache" else "graphs"
    loaded, where = _loaded(row) if "start_s" in row else (0, "")
    regions = row.get("regions")
    cells: Sequence[str] = (
        str(row["layers"]),
        row["system"],
        row["cache"],
        f"{row['start_s']:.2f} s" if "start_s" in row else "-",
        f"{row['steady_step_s'] * 1e3:.1f} ms" if row.get("steady_step_s") else "-",
        f"{row['compiles']} {unit}" if row.get("compiles") else str(row.get("compiles", "-")),
        f"{loaded} {unit} ({where})" if loaded else "-",
        f"{regions} ({row['unique_regions']})" if regions is not None else "-",
        row.get("error") or (f"{err:.1e}" if err is not None else ""),
    )
    return "  ".join(c.ljust(w) if w else c for c, w in zip(cells, _WIDTHS, strict=True)) + "\n"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
