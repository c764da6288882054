"""A Python that has imported torch, forking the suite's fresh processes (`tests/fresh.py`).

Most fresh processes the suite starts (a warm start is a new process) spend 4-7 s of CPU
importing torch, Dynamo and Inductor before they do what the test is about: about a third of
the suite's time on two cores. This server imports them once, then forks a child per request
that runs the request's `python -c SCRIPT`, `python -m MODULE` or `python FILE` as the
interpreter would: its own environment, working directory, argv and standard streams,
`__main__`, exit code, and at exit the joining of non-daemon threads and `atexit` handlers.
The child starts as a new process that has imported these modules and done nothing else: no
fcache module, no Dynamo cache, nothing compiled. Whatever the imports read from the
environment is the server's, so `fresh.run` sends only requests whose environment differs
from the server's in variables read after import (`fresh.LATE_VARIABLES`), and starts the
others itself.

Protocol (one Unix socket connection per request): the client sends its three standard
streams' file descriptors with the first bytes, then the request as JSON (argv, env, cwd),
and shuts down writing; the server answers the child's pid, then its exit code (negative:
the signal that killed it), a line each. Usage: `python -m tests.forkserver SOCKET`; it
prints "ready" when it accepts requests and exits when its standard input closes (the
client's end, at the client's exit or death); or prints why not and exits (where the
imports initialized CUDA, which a forked child cannot use).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

PRELOAD = ("torch", "torch._dynamo", "torch._inductor.compile_fx")


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    if _children_cannot_use_cuda():
        print("unfit: the imports initialized CUDA", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # Sessions (one per request) are not waited for: the kernel reaps them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    sys.stderr.flush()
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is sys.stdin:  # the client is gone: so is the server
                if not sys.stdin.buffer.read1(1):
                    return
                continue
            conn, _ = listener.accept()
            if os.fork() == 0:
                events.close()
                listener.close()
                _session(conn)  # never returns
            conn.close()


def _children_cannot_use_cuda() -> bool:
    """Whether a child forked now would fail at its first CUDA call ("Cannot re-initialize
    CUDA in forked subprocess"): torch marks a fork bad once the parent has asked the CUDA
    driver anything, as the imports do on a GPU machine. Asked of a child, as torch tells."""
    pid = os.fork()
    if pid == 0:
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _session(conn: socket.socket) -> None:
    """Receives one request, forks its child, reports its pid and exit code, exits."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the child's own children are waited for
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        chunks = [data]
        while chunk := conn.recv(1 << 16):
            chunks.append(chunk)
        request = json.loads(b"".join(chunks))
        pid = os.fork()
        if pid == 0:
            conn.close()
            os._exit(_child(request, fds))
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Becomes the requested process: streams, directory, environment, path, argv; runs it
    and returns its exit code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    site = [p for p in sys.path[1:] if p not in _pythonpath(os.environ)]
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    if argv[1] in ("-c", "-m"):  # what python puts first on the path
        first = "" if argv[1] == "-c" else os.getcwd()
    else:
        first = os.path.dirname(os.path.abspath(argv[1]))
    sys.path[:] = list(dict.fromkeys([first, *_pythonpath(os.environ), *site]))
    return _run(argv)


def _pythonpath(env: Any) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run(argv: list[str]) -> int:
    """Runs `python -c SCRIPT ARGS`, `python -m MODULE ARGS` or `python FILE ARGS` (argv[1:])
    as the interpreter does, to its exit: the exit code."""
    import atexit
    import runpy
    import threading
    import traceback
    import types

    try:
        if argv[1] == "-c":
            sys.argv = ["-c", *argv[3:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[2], "<string>", "exec"), main.__dict__)
        elif argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:  # a script's path
            sys.argv = argv[1:]
            runpy.run_path(argv[1], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        kind, exc, trace = sys.exc_info()  # the traceback from the script on, as python's
        traceback.print_exception(kind, exc, trace.tb_next if trace else None)
        code = 1
    # What the interpreter does at exit, in its order: wait for non-daemon threads, then
    # run the atexit handlers (fcache's own among them), then flush the streams.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:  # a script may close its own
                stream.flush()
        except Exception:
            code = code or 120  # the interpreter's code for a failed flush at exit
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[1])
