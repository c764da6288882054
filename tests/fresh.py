"""Fresh Python processes for tests (a warm start is a new process).

`run` and `popen` are `subprocess.run` and `subprocess.Popen` for a `[sys.executable, "-c" |
"-m" | FILE, ...]` command: where the command's environment differs from the one the
server started with only in variables read after import (`LATE_VARIABLES`), it is forked
from that server (tests/forkserver.py), which has imported torch, Dynamo and Inductor
already: 4-7 s of CPU saved a process. Otherwise, or with `FCACHE_TEST_FORKSERVER=0`, it
is started as usual. Either way the child has its own environment, directory, streams and
exit code, and imported nothing of fcache. Tests of what a process imports start theirs
as usual.

`run_json` runs a script whose report is the JSON object on the last line it prints. The
repository and the caller's own PYTHONPATH come first on its path; `env` adds variables
(cache directories, settings).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
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
log = logging.getLogger(__name__)

# Variables a forked child may set differently from the server: read when used, never
# while torch, Dynamo or Inductor are imported. (PYTHONHASHSEED, GLIBC_TUNABLES, HOME, OMP_*,
# TORCH_*, TORCHDYNAMO_*, CXX and other TORCHINDUCTOR_* are read at start or import: a
# command that sets them differently is started as usual.)
LATE_VARIABLES = frozenset({
    "PYTHONPATH", "PATH", "TORCHINDUCTOR_CACHE_DIR",
    # Inductor sets it in a process that loads a C++ kernel, which reads it as it loads.
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
})  # fmt: skip
LATE_PREFIXES = ("FCACHE_", "PYTEST_")  # PYTEST_CURRENT_TEST changes at every test

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
    pipe = subprocess.PIPE if capture_output else None
    stdin = subprocess.PIPE if input is not None else None
    with popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=pipe, stderr=pipe, text=text) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def popen(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    text: bool = False,
) -> Any:
    """`subprocess.Popen(argv, ...)` for a Python command, forked where that is the same
    (then a `Forked`: the part of Popen's interface the tests use). The streams are None
    (this process's), `subprocess.PIPE`, `subprocess.DEVNULL`, or for stderr
    `subprocess.STDOUT`."""
    environ = dict(os.environ if env is None else env)
    server = _forkserver() if _forkable(argv) else None
    if server is not None and (differ := _start_differences(environ, _server["env"])):
        log.info("fresh: %s started, not forked: it sets %s otherwise", argv[1], differ)
        server = None
    if server is None:
        return subprocess.Popen(argv, env=environ, cwd=cwd, stdin=stdin, stdout=stdout,
                                stderr=stderr, text=text)  # fmt: skip
    return Forked(server, argv, environ, cwd, (stdin, stdout, stderr), text)


def run_json(script: str, timeout: float = 600, **env: str) -> dict[str, Any]:
    environ = {
        **os.environ,
        "PYTHONPATH": _root_first(),
        **env,
    }
    proc = run([sys.executable, "-c", script], env=environ, capture_output=True, text=True,
               timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _root_first() -> str:
    """PYTHONPATH with this checkout first, then what the environment adds."""
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def _late(name: str) -> bool:
    return name in LATE_VARIABLES or name.startswith(LATE_PREFIXES)


def _forkable(argv: list[str]) -> bool:
    """A Python command the server can run, where forking is on."""
    if os.environ.get("FCACHE_TEST_FORKSERVER", "1") == "0" or sys.platform != "linux":
        return False
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    return len(argv) > 2 if argv[1] in ("-c", "-m") else argv[1].endswith(".py")


def _start_differences(env: dict[str, str], server: dict[str, str]) -> list[str]:
    """The variables read at start-up or import that `env` sets otherwise than the server's
    environment did (none: a process started with `env` would import torch as the server
    did). Against the server's own environment, not this process's now: a test or torch
    itself may have changed that since."""
    names = set(env) | set(server)
    return sorted(n for n in names if not _late(n) and env.get(n) != server.get(n))


def _forkserver() -> str | None:
    """This process's server, started at the first call (None if it cannot start)."""
    with _lock:
        if "proc" not in _server:
            _server["proc"] = None
            folder = tempfile.mkdtemp(prefix="fcache-forkserver-")
            path = os.path.join(folder, "socket")
            env = {**os.environ, "PYTHONPATH": _root_first()}
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT,
            )  # fmt: skip
            assert proc.stdout is not None
            if (answer := proc.stdout.readline().strip()) == b"ready":
                _server.update(proc=proc, path=path, env=env)
                atexit.register(_stop, proc)
            else:
                log.info("fresh: no fork server (%s): processes are started", answer.decode())
                _stop(proc)
        proc = _server["proc"]
        return str(_server["path"]) if proc is not None and proc.poll() is None else None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()  # the server exits at end of input
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Forked:
    """A child forked by the server: pid, pipes, poll, wait, communicate, kill, as
    `subprocess.Popen` has them. Its exit code comes from the server (its parent)."""

    def __init__(
        self,
        server: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike[str] | None,
        streams: tuple[int | None, int | None, int | None],
        text: bool,
    ) -> None:
        self.args = argv
        self.returncode: int | None = None
        self._text = text
        self.stdin: Any = None
        self.stdout: Any = None
        self.stderr: Any = None
        theirs: list[int] = []  # the child's stdin, stdout, stderr
        ours: list[tuple[str, int]] = []
        try:
            for fd, (name, how) in enumerate(
                zip(("stdin", "stdout", "stderr"), streams, strict=True)
            ):
                if how == subprocess.PIPE:
                    read_end, write_end = os.pipe()
                    mine, child = (write_end, read_end) if fd == 0 else (read_end, write_end)
                    ours.append((name, mine))
                    theirs.append(child)
                elif how == subprocess.STDOUT and fd == 2:
                    theirs.append(os.dup(theirs[1]))
                elif how == subprocess.DEVNULL or (how is None and fd == 0):
                    theirs.append(os.open(os.devnull, os.O_RDWR))
                elif how is None:
                    theirs.append(os.dup(fd))
                else:
                    raise ValueError(f"fresh.popen: {name}={how!r} is not supported")
            self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._conn.connect(server)
            request = json.dumps({"argv": argv, "env": env, "cwd": os.fspath(cwd or os.getcwd())})
            payload = request.encode()
            socket.send_fds(self._conn, [payload[:1]], theirs)
            self._conn.sendall(payload[1:])
            self._conn.shutdown(socket.SHUT_WR)
        finally:
            for fd in theirs:
                os.close(fd)
        for name, fd in ours:
            mode = ("w" if name == "stdin" else "r") + ("" if text else "b")
            buffering = 1 if text and name == "stdin" else -1  # lines reach the child as written
            setattr(self, name, open(fd, mode, buffering=buffering))  # noqa: SIM115 (closed by us)
        self._replies = b""
        self.pid = int(self._line(None))

    def _line(self, timeout: float | None) -> bytes:
        """The server's next line, waiting up to `timeout` (None: for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._replies:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            self._conn.settimeout(left)
            chunk = self._conn.recv(64)
            if not chunk:
                raise RuntimeError("fresh: the fork server ended before reporting an exit")
            self._replies += chunk
        line, self._replies = self._replies.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self.returncode = int(self._line(0.0001))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self._line(timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
        return self.returncode

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> Any:
        """Writes `input`, reads stdout and stderr to their ends, waits for the exit."""
        deadline = None if timeout is None else time.monotonic() + timeout
        data = input.encode() if isinstance(input, str) else input
        files = {n: f for n in ("stdin", "stdout", "stderr") if (f := getattr(self, n))}
        try:
            out, err = _communicate({n: f.fileno() for n, f in files.items()}, data, deadline)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
        finally:
            for f in files.values():
                with contextlib.suppress(OSError):
                    f.close()
        self.wait(None if deadline is None else max(0.0001, deadline - time.monotonic()))
        decode = (lambda b: b.decode()) if self._text else (lambda b: b)
        return (decode(out) if "stdout" in files else None,
                decode(err) if "stderr" in files else None)  # fmt: skip

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the kernel may have given to another process
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self.wait()
        self._conn.close()


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
