"""A compile that hangs past its deadline (Settings.compile_timeout_s) fails with
CompileError, so its region falls back, instead of hanging the model: a worker process is
killed and the next region gets a fresh one; a side-thread compile is abandoned and the
compiles after it run on a new thread."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch

import fcache
from fcache import process
from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.engine.compile import workers
from fcache.engine.compile.workers import CompilePool
from fcache.errors import CompileError
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target
from tests.graphs import capture_regions

RELEASE = threading.Event()  # lets hung compiles end when a test is over


class HangingExecutor:
    name, version, persistent, compile_in_worker = "hang", "1", True, False

    def available(self, device_type: str) -> bool:
        return True

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        return True

    def toolchain(self, target: Target) -> Mapping[str, str]:
        return {}

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        RELEASE.wait(60)
        raise CompileError("released")

    def load(self, artifact: Artifact, device: torch.device):  # type: ignore[no-untyped-def]
        raise AssertionError("never compiled")


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()


@functools.cache
def _region() -> CanonicalRegion:
    (region,) = capture_regions(lambda f: f(torch.randn(4)), lambda x: (x * 2).sin())
    return region


def _sleeper(workers_: int) -> subprocess.Popen[bytes]:
    """A 'worker' that reads its request and never answers."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_a_hung_worker_is_killed_at_the_deadline_and_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    real_spawn = workers._spawn

    def spawn(n: int) -> subprocess.Popen[bytes]:
        proc = _sleeper(n) if not spawned else real_spawn(n)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(workers, "_spawn", spawn)
    pool = CompilePool(2, timeout_s=1.0)
    try:
        eager = registry.create("eager")
        start = time.monotonic()
        hung = pool.submit(eager, _region(), torch.device("cpu"), parallel=True)
        with pytest.raises(CompileError, match="1 s deadline; its worker process was killed"):
            hung.result(timeout=30)
        assert time.monotonic() - start < 20
        assert spawned[0].wait(10) is not None  # killed
        # The next region gets a fresh worker, which compiles (given time to import torch).
        pool.timeout_s = 300
        done = pool.submit(eager, _region(), torch.device("cpu"), parallel=True)
        assert done.result(timeout=120).executor == "eager"
    finally:
        pool.close()


def test_a_hung_side_thread_compile_is_abandoned_and_the_next_runs() -> None:
    pool = CompilePool(1, timeout_s=0.5)
    try:
        hung = pool.submit(HangingExecutor(), _region(), torch.device("cpu"), parallel=False)
        queued = pool.submit(
            registry.create("eager"), _region(), torch.device("cpu"), parallel=False
        )
        with pytest.raises(CompileError, match="its compile thread was abandoned"):
            hung.result(timeout=10)
        assert queued.result(timeout=10).executor == "eager"
    finally:
        start = time.monotonic()
        pool.close()
        assert time.monotonic() - start < 5


def test_a_region_whose_compile_hangs_runs_in_eager(tmp_path: Path) -> None:
    registry.register("hang", HangingExecutor)
    try:
        settings = fcache.Settings(
            cache_dir=tmp_path,
            progress=False,
            executors=("hang", "eager"),
            compile_workers=1,
            compile_timeout_s=0.5,
        )

        def f(x: torch.Tensor) -> torch.Tensor:
            return (x * 2).sin() + 1

        model = fcache.jit(f, settings=settings)
        x = torch.randn(8)
        start = time.monotonic()
        assert torch.allclose(model(x), f(x))
        assert time.monotonic() - start < 30
        stats = fcache.stats(model)
        assert stats.fallback_reasons == {"compile-failed": stats.regions} and stats.regions
        assert stats.executors == {"eager": stats.unique_regions}
        process.reset()
        store = LmdbStore(tmp_path, 1 << 30)
        try:  # a deadline says nothing about the region: no refusal is remembered
            stored = [decode(store.get(entry.key)) for entry in store.entries()]  # type: ignore[arg-type]
            assert not [a for a in stored if a.refused]
        finally:
            store.close()
    finally:
        RELEASE.set()
        process.reset()


def test_the_deadline_is_a_setting() -> None:
    assert fcache.Settings().compile_timeout_s == workers.DEFAULT_TIMEOUT_S == 1800
    env = {"FCACHE_COMPILE_TIMEOUT": "90"}
    assert fcache.Settings.from_env(env).compile_timeout_s == 90
    with pytest.raises(fcache.ConfigError, match="FCACHE_COMPILE_TIMEOUT"):
        fcache.Settings.from_env({"FCACHE_COMPILE_TIMEOUT": "soon"})


class _InWorker:
    """The eager executor's name, asking for worker processes (eager itself does not)."""

    name = "eager"
    compile_in_worker = True


def test_prestarted_workers_start_before_any_region_and_then_compile() -> None:
    pool = CompilePool(2, timeout_s=300)
    try:
        pool.prestart(_InWorker(), torch.device("cpu"))  # type: ignore[arg-type]
        pool.prestart(_InWorker(), torch.device("cpu"))  # type: ignore[arg-type]  # once
        deadline = time.monotonic() + 120
        while len(pool._processes) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pool._processes) == 2  # started with no region submitted
        done = pool.submit(registry.create("eager"), _region(), torch.device("cpu"), parallel=True)
        assert done.result(timeout=120).executor == "eager"
        assert len(pool._processes) == 2  # the warm workers took it: none started for it
    finally:
        pool.close()


def test_the_probe_region_is_one_small_region_any_executor_compiles() -> None:
    from fcache.frontend.samples import probe_region

    region = probe_region(torch.device("cpu"))
    assert [node.op for node in region.nodes] == ["aten.mul.Tensor", "aten.add.Tensor"]
    eager = registry.create("eager")
    fn = eager.load(eager.compile(region, torch.device("cpu")), torch.device("cpu"))
    x = torch.arange(1024.0)
    torch.testing.assert_close(fn([x, x])[0], x * 3)


def test_an_idle_worker_exits_and_the_next_compile_starts_another() -> None:
    pool = CompilePool(2, timeout_s=300, idle_s=1.0)
    eager = registry.create("eager")
    try:
        done = pool.submit(eager, _region(), torch.device("cpu"), parallel=True)
        assert done.result(timeout=120).executor == "eager"
        (first,) = pool._processes
        assert first.wait(30) is not None  # gone after a second with nothing to compile
        deadline = time.monotonic() + 10
        while pool._processes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool._processes
        again = pool.submit(eager, _region(), torch.device("cpu"), parallel=True)
        assert again.result(timeout=120).executor == "eager"
        assert len(pool._processes) == 1 and first not in pool._processes
    finally:
        pool.close()


def test_workers_take_the_largest_waiting_region_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regions waiting for a worker (all of a graph's, while the workers start) go out
    largest first, by op count; equal sizes in arrival order, warm-ups before them."""
    (small,) = capture_regions(lambda f: f(torch.randn(4)), lambda x: x.sin())
    (other,) = capture_regions(lambda f: f(torch.randn(4)), lambda x: x.cos())
    (large,) = capture_regions(lambda f: f(torch.randn(4)), lambda x: (x * 2).sin().cos() + 1)
    (medium,) = capture_regions(lambda f: f(torch.randn(4)), lambda x: (x * 2).sin())
    assert len(small.nodes) == len(other.nodes) < len(medium.nodes) < len(large.nodes)
    pool = CompilePool(2, timeout_s=300)
    monkeypatch.setattr(pool, "_start_workers", lambda: None)  # nothing takes them yet
    eager, cpu = registry.create("eager"), torch.device("cpu")
    for region in (small, medium, other, large):
        pool.submit(eager, region, cpu, parallel=True)
    pool.prestart(_InWorker(), cpu)  # type: ignore[arg-type]
    taken = []
    while not pool._jobs.empty():
        _, _, (_, _, text, _) = pool._jobs.get_nowait()
        taken.append(text)
    assert taken == [workers.WARM_UP] * 2 + [r.text for r in (large, medium, small, other)]
