"""Fresh processes for the benchmark: the measured `bench.measure` processes (one, or
several started at once), their environments and cache directories, and `fcache-server`.

Every measured process gets its own session (process group), so a timeout kills it with
everything it started (compile workers, C++ compilers). A process that fails, hangs or
prints no report becomes a result with an "error" and the tail of its stderr; nothing here
raises for a measured process's failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_STDERR_TAIL = 2000
_STDERR_SCAN = 200_000  # how far back from the end of stderr to look for the exception
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")
_SERVER_START_S = 60.0


@dataclass(frozen=True)
class Caches:
    """The cache directories one measured process sees. Cold means they are empty."""

    fcache: Path
    inductor: Path
    server: str | None = None
    # The CUDA driver's JIT cache (cuDNN's runtime-compiled attention kernels land there):
    # the machine's, not a compiler's. None: inside the Inductor directory.
    cuda: Path | None = None


def environment(
    caches: Caches,
    cuda_device: int | None = None,
    compile_workers: int | None = None,
    threads: int | None = None,
    local_ranks: int | None = None,
) -> dict[str, str]:
    """The parent's environment with fcache's and the compilers' caches pointed at `caches`.

    No FCACHE_* variable leaks in from the caller (the benchmark's own FCACHE_BENCH_* pass).
    `local_ranks`: the processes started together on this machine, told as torchrun tells
    its ranks (LOCAL_WORLD_SIZE), so that each takes its share of the cores; a single run
    is told nothing. Triton's cache lives inside the Inductor directory, so a fresh Inductor
    directory is a cold start for every compiler underneath it, and a reused one is warm for
    all of them; the CUDA driver's cache too, unless `caches.cuda` puts it elsewhere.
    """
    env = _own_environ()
    env.update(
        FCACHE_DIR=os.fspath(caches.fcache),
        FCACHE_PROGRESS="0",
        TORCHINDUCTOR_CACHE_DIR=os.fspath(caches.inductor),
        TRITON_CACHE_DIR=os.fspath(caches.inductor / "triton"),
        CUDA_CACHE_PATH=os.fspath(caches.cuda or caches.inductor / "cuda"),
        PYTHONPATH=os.pathsep.join(filter(None, (os.fspath(ROOT), os.environ.get("PYTHONPATH")))),
    )
    if caches.server is not None:
        env["FCACHE_SERVER"] = caches.server
    if compile_workers is not None:
        env["FCACHE_COMPILE_WORKERS"] = str(compile_workers)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if local_ranks is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_ranks)
    if cuda_device is not None:
        # Each library then sees one GPU as cuda:0; nvFuser and Thunder assume device 0.
        env["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
    return env


def _own_environ() -> dict[str, str]:
    """The parent's environment without what a launched process must be told afresh:
    fcache's settings, and how many ranks share the machine. The benchmark's own
    variables (FCACHE_BENCH_*: the commit, log level, profiles) pass."""
    return {
        k: v
        for k, v in os.environ.items()
        if (k.startswith("FCACHE_BENCH_") or not k.startswith("FCACHE_"))
        and k != "LOCAL_WORLD_SIZE"
    }


def run_command(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "bench.measure", *argv]


def shown_command(argv: Sequence[str]) -> str:
    """`run_command(argv)` as a user would type it, for the results: the interpreter's
    path is this machine's, not the run's."""
    return shlex.join(["python", *run_command(argv)[1:]])


@dataclass
class Launched:
    """One measured process on its way."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float  # time.time() at launch


def launch(argv: Sequence[str], env: Mapping[str, str], logs: Path) -> Launched:
    """Start `python -m bench.measure ARGV`; stdout and stderr go to files in `logs`."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "stdout.txt", logs / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            run_command(argv),
            cwd=ROOT,
            env=dict(env),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Launched(process, out, err, time.time())


def collect(runs: Sequence[Launched], deadline: float) -> list[dict[str, Any]]:
    """Wait for every run until `deadline` (time.monotonic()); each one's report, or an
    {"error": ...}; runs still going at the deadline are killed with their process group.
    `exit_unix` is when this process saw the run end (within 20 ms)."""
    results: list[dict[str, Any] | None] = [None] * len(runs)
    ended: list[float | None] = [None] * len(runs)
    try:
        while True:
            for i, run in enumerate(runs):
                if ended[i] is None and run.process.poll() is not None:
                    ended[i] = time.time()
            if all(e is not None for e in ended):
                break
            if time.monotonic() > deadline:
                for i, run in enumerate(runs):
                    if ended[i] is None:
                        _kill_group(run.process)
                        results[i] = {"error": f"timeout after {time.time() - run.started:.0f} s"}
                        ended[i] = time.time()
                break
            time.sleep(0.02)
    except BaseException:  # interrupted: take the running processes down with us
        for run in runs:
            if run.process.poll() is None:
                _kill_group(run.process)
        raise
    done: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        result = results[i] if results[i] is not None else _report(run)
        assert result is not None
        result["process_wall_s"] = round((ended[i] or time.time()) - run.started, 3)
        result["exit_unix"] = ended[i]
        if "error" in result:
            text = _tail(run.stderr, _STDERR_SCAN)
            if cause := _last_exception(text):
                result["error"] += f": {cause}"
            result["stderr_tail"] = text[-_STDERR_TAIL:]
        done.append(result)
    return done


def _report(run: Launched) -> dict[str, Any]:
    code = run.process.returncode
    lines = run.stdout.read_text(errors="replace").strip().splitlines()
    if code != 0:
        return {"error": f"exit code {code}"}
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        return {"error": "no JSON report on the last line of stdout"}


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(path: Path, size: int = _STDERR_TAIL) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_exception(text: str) -> str | None:
    """The last "SomeError: message" line of a Python traceback in `text`, cut short. C++
    frames that torch prints after it would otherwise bury the cause."""
    for line in reversed(text.splitlines()):
        if _EXCEPTION.match(line):
            return line.strip()[:300]
    return None


@contextmanager
def server(workdir: Path, flags: Sequence[str] = ()) -> Iterator[str]:
    """A fresh fcache-server with its store in `workdir` (what `fcache-server` runs:
    `python -m service.main`), on a Unix socket in a short temporary directory (socket
    paths are limited to 107 bytes); yields its address; SIGTERM, then SIGKILL, at the end.
    `flags`: more of fcache-server's flags (`--signing-key-file FILE`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    sockets = Path(tempfile.mkdtemp(prefix="fcs-"))
    ready = workdir / "ready.json"
    log = workdir / "server.log"
    args = [
        sys.executable, "-m", "service.main",
        "--db", os.fspath(workdir / "db"),
        "--listen", f"unix:{sockets / 's.sock'}",
        "--ready-file", os.fspath(ready),
        "--grace", "5",
        "--log-level", "WARNING",
        *flags,
    ]  # fmt: skip
    env = _own_environ()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.fspath(ROOT), env.get("PYTHONPATH"))))
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield _wait_ready(process, ready, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                _kill_group(process)
        shutil.rmtree(sockets, ignore_errors=True)


def _wait_ready(process: subprocess.Popen[bytes], ready: Path, log: Path) -> str:
    deadline = time.monotonic() + _SERVER_START_S
    while time.monotonic() < deadline:
        if ready.exists():
            try:
                addresses = json.loads(ready.read_text())["addresses"]
            except (ValueError, KeyError):
                addresses = None  # written but not yet complete
            if addresses:
                return str(addresses[0])
        if process.poll() is not None:
            raise RuntimeError(f"fcache-server exited with {process.returncode}: {_tail(log)}")
        time.sleep(0.05)
    raise RuntimeError(f"fcache-server did not start in {_SERVER_START_S:.0f} s: {_tail(log)}")
