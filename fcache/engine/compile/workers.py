"""Compile workers: processes that compile regions in parallel on a cold start.

A cold model has tens of unique regions, and each compile is mostly a C++ or Triton build:
compiled one after another they leave the machine idle. `CompilePool` runs
`executor.compile` in worker processes and hands back artifacts. A worker receives only the
executor's name, the device and the canonical text: a compile is a pure function of those,
which is what makes its artifact valid for every process that shares the key.

Workers are `python -m fcache.engine.compile.workers` subprocesses speaking length-prefixed
frames over their stdin/stdout, not multiprocessing: a spawned multiprocessing child re-imports the
user's main script, which re-runs a training script that lacks an `if __name__` guard
(Inductor's own compile workers avoid multiprocessing for the same reason). No pickle.

With one worker, or one region to compile, the compile runs in the parent on a side thread
instead; starting a worker costs a torch import. The side thread also keeps Inductor and
torch.export away from the capturing thread's Dynamo and AOTAutograd state.

Order: a worker takes the largest region waiting first (by its number of ops). A cold
start hands out every region of a graph at once, usually before the workers have
started; the largest take longest to compile (GPT-2 at 2 layers on an H100: 2.8 s for a
45-op backward region, 0.1-1.4 s for the other twelve), and taken in arrival order the
largest began a second after the rest and ended the start alone.

Deadline: a compile that takes longer than `timeout_s` (Settings.compile_timeout_s,
FCACHE_COMPILE_TIMEOUT) fails with CompileInterrupted (a CompileError, not remembered as a
refusal), so its region goes to the next executor (eager at the end) instead of hanging
the model. A worker process past the deadline is killed (Inductor's own compile
subprocesses notice their parent's death and exit) and the next region starts a fresh one.
A side-thread compile cannot be killed: its thread is abandoned (a daemon, so it does not
hold up exit) and a new one takes the compiles after it.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import queue
import struct
import subprocess
import sys
import threading
import traceback
import warnings
from concurrent.futures import Future
from typing import IO, Any

import torch

from fcache.cache.artifact import Artifact, decode, encode
from fcache.config import Settings, local_ranks
from fcache.engine.compile.slots import Slot, Slots
from fcache.errors import CompileError, CompileInterrupted
from fcache.executors.base import Executor
from fcache.frontend.canonicalize import CanonicalRegion

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
# Settings' default: the deadline of a pool built without one.
DEFAULT_TIMEOUT_S = Settings.__dataclass_fields__["compile_timeout_s"].default
# A worker process with no compile for this long exits; the next compile starts another.
# A cold start sends regions seconds apart, and a training job then compiles nothing for
# hours: its idle workers would keep what each holds (on a GPU a CUDA context, with what
# autotuning and validation left in its allocator) for the job's whole life.
IDLE_S = 120.0


def compile_quietly(executor: Executor, region: CanonicalRegion, device: torch.device) -> Artifact:
    # torch.export and Inductor warn about their own internals (deprecated pytree APIs and
    # the like): noise to an fcache user, repeated for every region.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        return executor.compile(region, device)


# A compile request to a worker thread: executor name, device, canonical text, the future.
_Request = tuple[str, str, bytes, "Future[Any]"]
# The canonical text of a warm-up request: the worker compiles `probe_region` (CUDA) or
# only starts (elsewhere: importing torch is its one-time cost); no artifact comes back.
WARM_UP = b""


class CompilePool:
    """Thread-safe. Worker processes start on first use and live until `close()`, until
    they have had no compile for `idle_s` (a later compile starts another), or as long as
    this process: when it exits, their stdin closes and they end (`main` returns on EOF)."""

    def __init__(
        self, workers: int, timeout_s: float = DEFAULT_TIMEOUT_S, idle_s: float = IDLE_S
    ) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        # (order, arrival, request): warm-ups first, then the largest regions, and the
        # stop signals (None) after everything queued before them.
        self._jobs: queue.PriorityQueue[tuple[float, int, _Request | None]] = queue.PriorityQueue()
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._processes: set[subprocess.Popen[bytes]] = set()
        self._local = _SideThread(self)
        self._closed = False
        self._prestarted = False
        self._worker_slots = Slots(max(1, workers))
        self._local_slots = Slots(1)

    def slot(self, size: int, *, parallel: bool) -> Slot:
        """A place in line for a compile slot for a region of `size` ops (its `wait`
        returns once it holds one), to hold from before the region's lease is asked for
        until its compile returns (fcache.engine.compile.slots): one per worker process, or the
        in-process thread's one, as `submit` with the same `parallel` would run it."""
        return (self._worker_slots if self._in_workers(parallel) else self._local_slots).join(size)

    def _in_workers(self, parallel: bool) -> bool:
        """Whether a compile asked for with `parallel` runs in a worker process."""
        return parallel and self.workers >= 2

    def submit(
        self, executor: Executor, region: CanonicalRegion, device: torch.device, *, parallel: bool
    ) -> Future[Artifact]:
        """Compile in a worker process when `parallel` (and workers > 1), else in-process."""
        if not self._in_workers(parallel):
            return self._local.submit(executor, region, device)
        self._start_workers()
        future: Future[Artifact] = Future()
        self._put(-len(region.nodes), (executor.name, str(device), region.text, future))
        return future

    def prestart(self, executor: Executor, device: torch.device) -> None:
        """Start the worker processes now, each compiling a tiny region on `device` to pay
        its one-time costs (importing torch and the compiler, the device's context; 4.5-5
        s for Inductor on an H100 host) while the caller is still tracing, so that a cold
        start's first regions find warm workers. Once per pool; nothing without workers."""
        if self.workers < 2 or not executor.compile_in_worker:
            return
        with self._lock:
            if self._prestarted or self._closed:
                return
            self._prestarted = True
        self._start_workers()
        for _ in range(self.workers):  # the first request each idle worker takes
            self._put(-math.inf, (executor.name, str(device), WARM_UP, Future()))
        log.debug("fcache: %d compile workers warming up for %s", self.workers, device)

    def close(self) -> None:
        """Stop the workers (a compile in flight is abandoned: its caller's future fails)
        and the in-process compile thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._put(math.inf, None)
        with self._lock:
            processes = list(self._processes)
        for process in processes:
            _stop(process)
        for thread in threads:
            thread.join()
        self._local.close()

    def _put(self, order: float, request: _Request | None) -> None:
        self._jobs.put((order, next(self._arrivals), request))

    def _start_workers(self) -> None:
        with self._lock:
            if self._closed:
                raise CompileInterrupted("the compile pool is closed")
            while len(self._threads) < self.workers:
                thread = threading.Thread(target=self._serve, daemon=True, name="fcache-worker")
                thread.start()
                self._threads.append(thread)

    def _serve(self) -> None:
        """One worker process, fed jobs one at a time; restarted if it dies."""
        process: subprocess.Popen[bytes] | None = None
        while True:
            try:
                _, _, job = self._jobs.get(timeout=self.idle_s if process is not None else None)
            except queue.Empty:  # idle: the process goes, this thread waits for work
                assert process is not None
                self._retire(process)
                process = None
                continue
            if job is None:
                break
            executor, device, text, future = job
            if not future.set_running_or_notify_cancel():
                continue
            if text == WARM_UP and process is not None and process.poll() is None:
                future.set_result(None)  # this worker has paid its start-up already
                continue
            if process is None or process.poll() is not None:
                process = _spawn(self.workers)
                with self._lock:
                    self._processes.add(process)
            try:
                future.set_result(self._ask_in_time(process, executor, device, text))
            except Exception as exc:
                future.set_exception(exc)
        if process is not None:
            self._retire(process)

    def _retire(self, process: subprocess.Popen[bytes]) -> None:
        _stop(process)
        with self._lock:
            self._processes.discard(process)

    def _ask_in_time(
        self, process: subprocess.Popen[bytes], executor: str, device: str, text: bytes
    ) -> Artifact | None:
        """`_ask`, with the worker killed once the deadline passes."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()  # its pipe closes: _ask fails with "compile worker died"

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            return _ask(process, executor, device, text)
        except CompileError:
            if expired.is_set():
                raise _late(executor, self.timeout_s, "its worker process was killed") from None
            raise
        finally:
            timer.cancel()
            timer.join()


def _late(executor: str, timeout_s: float, what: str) -> CompileInterrupted:
    log.warning(
        "fcache: compiling a region with %s took over %g s (FCACHE_COMPILE_TIMEOUT); %s, "
        "the region goes to the next executor",
        executor,
        timeout_s,
        what,
    )
    return CompileInterrupted(f"{executor} compile exceeded the {timeout_s:g} s deadline; {what}")


class _SideThread:
    """In-process compiles, one at a time on a daemon thread, each under the pool's
    deadline. A compile past it fails its future at once; its thread, which cannot be
    stopped, is abandoned to finish (its result is dropped) and a new thread takes the
    compiles queued after it. Thread-safe."""

    def __init__(self, pool: CompilePool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._jobs: queue.Queue[_LocalJob | None] | None = None
        self._thread: threading.Thread | None = None

    def submit(
        self, executor: Executor, region: CanonicalRegion, device: torch.device
    ) -> Future[Artifact]:
        future: Future[Artifact] = Future()
        with self._lock:
            if self._jobs is None:
                self._start()
            assert self._jobs is not None
            self._jobs.put((executor, region, device, future))
        return future

    def close(self) -> None:
        """Wait for the compile in progress (not for an abandoned one) and stop. Idempotent."""
        with self._lock:
            jobs, thread = self._jobs, self._thread
            self._jobs = self._thread = None
        if jobs is not None and thread is not None:
            jobs.put(None)
            thread.join(self._pool.timeout_s)  # a hung compile is abandoned at its deadline

    def _start(self) -> None:
        self._jobs = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, args=(self._jobs,), daemon=True, name="fcache-compile"
        )
        self._thread.start()

    def _run(self, jobs: queue.Queue[_LocalJob | None]) -> None:
        while (job := jobs.get()) is not None:
            executor, region, device, future = job
            if not future.set_running_or_notify_cancel():
                continue
            timer = threading.Timer(self._pool.timeout_s, self._expire, (jobs, job))
            timer.daemon = True
            timer.start()
            try:
                result: Artifact | BaseException = compile_quietly(executor, region, device)
            except Exception as exc:
                result = exc
            finally:
                timer.cancel()
                timer.join()  # gone once cancelled: close() leaves no thread behind
            with self._lock:
                if future.done():  # expired: this thread was abandoned
                    return
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _expire(self, jobs: queue.Queue[_LocalJob | None], job: _LocalJob) -> None:
        executor, _, _, future = job
        with self._lock:
            if future.done():
                return
            future.set_exception(
                _late(executor.name, self._pool.timeout_s, "its compile thread was abandoned")
            )
            if self._jobs is not jobs:
                return
            # The compiles queued behind it move to a new thread.
            pending = []
            while True:
                try:
                    pending.append(jobs.get_nowait())
                except queue.Empty:
                    break
            self._start()
            for queued in pending:
                if queued is not None:
                    self._jobs.put(queued)  # type: ignore[union-attr]


_LocalJob = tuple[Executor, CanonicalRegion, torch.device, "Future[Artifact]"]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End a worker: EOF on its stdin asks it to return; kill it if it does not soon."""
    try:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _spawn(workers: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    # The worker imports fcache the way this process did, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # Each worker gets its share of the cores for Inductor's own parallel compiles (Triton
    # kernels and their autotuning configs). One thread each serialized those: on the H200
    # a RoPE-backward region took 65 s in a worker against 6.5 s for a simple one.
    threads = max(1, (os.cpu_count() or 1) // (workers * local_ranks()))
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    return subprocess.Popen(
        [sys.executable, "-m", "fcache.engine.compile.workers"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def _ask(
    process: subprocess.Popen[bytes], executor: str, device: str, text: bytes
) -> Artifact | None:
    assert process.stdin is not None and process.stdout is not None
    try:
        _send(process.stdin, json.dumps({"executor": executor, "device": device}).encode())
        _send(process.stdin, text)
        process.stdin.flush()
        status = json.loads(_receive(process.stdout))
        if not status["ok"]:
            failed = CompileInterrupted if status.get("interrupted") else CompileError
            log.debug("fcache: a compile worker failed:\n%s", status.get("trace", ""))
            raise failed(status["error"])
        if text == WARM_UP:
            return None
        return decode(_receive(process.stdout))
    except (OSError, EOFError) as exc:
        process.kill()
        raise CompileInterrupted(f"compile worker died: {exc}") from exc


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)


def _receive(stream: IO[bytes]) -> bytes:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("worker closed its output")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("worker closed its output mid-frame")
    return data


def main() -> None:
    """Worker loop: read (request, canonical text) frames, answer (status, artifact)."""
    from fcache.executors import registry
    from fcache.frontend.canonicalize import parse

    # Frames only on the real stdout; anything the compilers print goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    stdin = sys.stdin.buffer
    while True:
        try:
            request = json.loads(_receive(stdin))
            text = _receive(stdin)
        except EOFError:
            return
        try:
            executor = registry.create(request["executor"])
            device = torch.device(request["device"])
            if text == WARM_UP:
                _warm_up(executor, device)
                artifact = None
            else:
                artifact = compile_quietly(executor, parse(text), device)
        except Exception as exc:
            error = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            error["trace"] = traceback.format_exc()  # the parent logs it at debug level
            # A full GPU says nothing about the region: the caller must not remember it.
            error["interrupted"] = isinstance(exc, torch.OutOfMemoryError)
            _send(out, json.dumps(error).encode())
        else:
            _send(out, json.dumps({"ok": True}).encode())
            if artifact is not None:
                _send(out, encode(artifact))
        out.flush()


def _warm_up(executor: Executor, device: torch.device) -> None:
    """A worker's one-time costs, paid before its first region: on a GPU, a tiny compile
    (the compiler's imports, the CUDA context, Triton's and Inductor's own start-up)."""
    if device.type == "cuda":
        from fcache.frontend.samples import probe_region

        compile_quietly(executor, probe_region(device), device)


if __name__ == "__main__":
    main()
