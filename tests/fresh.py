"""Fresh Python processes for tests (a warm start is a new process).

`run` is `subprocess.run` for a `[sys.executable, "-c" | "-m" | FILE, ...]` command: where the
command's environment differs from this process's only in variables read after import
(`LATE_VARIABLES`), it is forked from a server that has imported torch, Dynamo and
Inductor already (tests/forkserver.py), which saves each such process 4-7 s of CPU;
otherwise, or with `FCACHE_TEST_FORKSERVER=0`, it is started as usual. Either way the child
has its own environment, directory, streams and exit code, and imported nothing of fcache.

`run_json` runs a script whose report is the JSON object on the last line it prints. The
repository and the caller's own PYTHONPATH come first on its path; `env` adds variables
(cache directories, settings).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Variables a forked child may set differently from the server: read when used, never
# while torch, Dynamo or Inductor are imported. (PYTHONHASHSEED, GLIBC_TUNABLES, HOME, OMP_*,
# TORCH_*, TORCHDYNAMO_*, CXX and other TORCHINDUCTOR_* are read at start or import: a
# command that sets them differently is started as usual.)
LATE_VARIABLES = frozenset({"PYTHONPATH", "PATH", "TORCHINDUCTOR_CACHE_DIR"})
LATE_PREFIXES = ("FCACHE_",)

_lock = threading.Lock()
_server: dict[str, Any] = {}


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    input: str | bytes | None = None,
    capture_output: bool = False,
    text: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(argv, ...)` for a Python command, forked where that is the same."""
    environ = dict(os.environ if env is None else env)
    server = _forkserver() if _forkable(argv, environ) else None
    if server is None:
        return subprocess.run(
            argv, env=environ, cwd=cwd, timeout=timeout, input=input,
            capture_output=capture_output, text=text, check=check,
        )  # fmt: skip
    proc = _run_forked(server, argv, environ, cwd, timeout, input, capture_output, text)
    if check:
        proc.check_returncode()
    return proc


def run_json(script: str, timeout: float = 600, **env: str) -> dict[str, Any]:
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **env,
    }
    proc = run([sys.executable, "-c", script], env=environ, capture_output=True, text=True,
               timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _late(name: str) -> bool:
    return name in LATE_VARIABLES or name.startswith(LATE_PREFIXES)


def _forkable(argv: list[str], env: dict[str, str]) -> bool:
    if os.environ.get("FCACHE_TEST_FORKSERVER", "1") == "0" or sys.platform != "linux":
        return False
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    python_args = len(argv) > 2 if argv[1] in ("-c", "-m") else argv[1].endswith(".py")
    if not python_args:
        return False
    names = set(env) | set(os.environ)
    return all(env.get(n) == os.environ.get(n) for n in names if not _late(n))


def _forkserver() -> tuple[subprocess.Popen[bytes], str] | None:
    """This process's server, started at the first call (None if it cannot start)."""
    with _lock:
        if "proc" not in _server:
            _server["proc"] = None
            folder = tempfile.mkdtemp(prefix="fcache-forkserver-")
            path = os.path.join(folder, "socket")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT,
            )  # fmt: skip
            assert proc.stdout is not None
            if proc.stdout.readline().strip() == b"ready":
                _server.update(proc=proc, path=path)
                atexit.register(_stop, proc)
            else:
                _stop(proc)
        proc = _server["proc"]
        return (proc, _server["path"]) if proc is not None and proc.poll() is None else None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()  # the server exits at end of input
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _run_forked(
    server: tuple[subprocess.Popen[bytes], str],
    argv: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
    input: str | bytes | None,
    capture_output: bool,
    text: bool,
) -> subprocess.CompletedProcess[Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    ours: dict[str, int] = {}  # our ends of the child's pipes
    theirs: list[int] = []  # the child's stdin, stdout, stderr
    if input is None:
        theirs.append(os.open(os.devnull, os.O_RDONLY))
    else:
        read_end, ours["stdin"] = os.pipe()
        theirs.append(read_end)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if capture_output:
            read_end, write_end = os.pipe()
            ours[name] = read_end
            theirs.append(write_end)
        else:
            theirs.append(os.dup(fd))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(server[1])
        request = {"argv": argv, "env": env, "cwd": os.fspath(cwd or os.getcwd())}
        payload = json.dumps(request).encode()
        socket.send_fds(conn, [payload[:1]], theirs)
        conn.sendall(payload[1:])
        conn.shutdown(socket.SHUT_WR)
    finally:
        for fd in theirs:
            os.close(fd)
    if deadline is not None:
        conn.settimeout(max(0.001, deadline - time.monotonic()))
    replies = conn.makefile("rb")
    pid = int(replies.readline())
    data = input.encode() if isinstance(input, str) else input
    try:
        out, err = _communicate(ours, data, deadline)
        if deadline is not None:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
        code = int(replies.readline())
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired(argv, timeout or 0.0) from None
    finally:
        for fd in ours.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()
    stdout: Any = out.decode() if text and capture_output else (out if capture_output else None)
    stderr: Any = err.decode() if text and capture_output else (err if capture_output else None)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _communicate(
    ours: dict[str, int], data: bytes | None, deadline: float | None
) -> tuple[bytes, bytes]:
    """Writes `data` to the child's stdin and reads its stdout and stderr to their ends."""
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    events = selectors.DefaultSelector()
    for name in ("stdout", "stderr"):
        if name in ours:
            events.register(ours[name], selectors.EVENT_READ, name)
    pending = memoryview(data or b"")
    if "stdin" in ours:
        if pending:
            events.register(ours["stdin"], selectors.EVENT_WRITE, "stdin")
        else:
            os.close(ours.pop("stdin"))
    while events.get_map():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError
        for key, _ in events.select(left):
            if key.data == "stdin":
                try:
                    pending = pending[os.write(key.fd, pending[:65536]) :]
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    events.unregister(key.fd)
                    os.close(ours.pop("stdin"))
                continue
            chunk = os.read(key.fd, 65536)
            if chunk:
                chunks[key.data].append(chunk)
            else:
                events.unregister(key.fd)
    return b"".join(chunks["stdout"]), b"".join(chunks["stderr"])
