"""Plain torch.compile users gain from fcache-server (`fcache.share_torch_compile`).

Two processes, each with an empty local Inductor cache, and one real server: the first
compiles and puts Inductor's FX-graph and AOTAutograd entries on the server; the second
finds every graph there. Inductor's own counters say so: FX-graph and AOTAutograd cache
hits, no miss, every hit from the remote cache class. On CPU no Triton is involved; what
torch still does there is build the cached C++ source with g++ (an FX entry carries source,
not the library), which the test counts and reports rather than hides. tests/gpu has the
CUDA half: no Triton kernel compiled in the second process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import fresh
from tests.e2e.runner import ROOT, compiler_shims
from tests.service.support import Launcher, ServerProcess, client

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "server").mkdir()
    launcher = Launcher(tmp_path / "server")
    yield launcher()
    launcher.stop_all()


def run(
    server: str, inductor_dir: Path, path: str | None = None, device: str = "cpu", **extra: str
) -> dict[str, Any]:
    """One process of tests/e2e/torch_share_run.py with an empty local Inductor cache."""
    assert not inductor_dir.exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(inductor_dir),
        # Triton's own cache too, so no kernel is found outside the server.
        TRITON_CACHE_DIR=str(inductor_dir / "triton"),
        PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        **extra,
    )
    if path:
        env["PATH"] = path
    proc = fresh.run(
        [sys.executable, "-m", "tests.e2e.torch_share_run", server, device],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_second_process_plain_torch_compile_hits_the_server(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = run(server.unix, tmp_path / "inductor-1")
    assert first["max_abs_error"] < 1e-5
    graphs = first["inductor"]["fxgraph_cache_miss"]
    assert graphs >= 2  # forward and backward, compiled
    assert first["remote_cache"]["RemoteFxGraphCache"]["put"] == graphs
    assert first["remote_cache"]["RemoteAOTAutogradCache"]["put"] == 1

    log = tmp_path / "compilers.log"
    second = run(server.unix, tmp_path / "inductor-2", compiler_shims(tmp_path / "bin", log))
    # Inductor's own counters: every graph found, none compiled, all from the remote cache.
    assert second["inductor"]["fxgraph_cache_hit"] == graphs
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["inductor"].get("fxgraph_cache_bypass", 0) == 0
    assert second["aot_autograd"]["autograd_cache_hit"] == 1
    assert second["aot_autograd"].get("autograd_cache_miss", 0) == 0
    assert second["remote_cache"]["RemoteFxGraphCache"] == {
        "hit": graphs, "miss": 0, "put": 0, "exception": 0
    }  # fmt: skip
    assert second["remote_cache"]["RemoteAOTAutogradCache"]["hit"] == 1
    assert second["triton_compiles"] == []
    # The same numbers as the first process: the same kernels.
    assert second["output_sum"] == first["output_sum"]
    assert second["grad_sum"] == first["grad_sum"]
    # fcache's side: hits counted per Inductor cache; the server saw the puts and the hits.
    assert second["fcache"]["torch:fx-graph-v1"]["hits"] == graphs
    stats = client(server.unix).server_stats()
    assert stats["counters"]["puts"] == graphs + 1  # type: ignore[index]
    assert stats["counters"]["hits"] == graphs + 1  # type: ignore[index]
    # What torch still does on CPU: g++ builds the cached C++ source (reported, not hidden).
    builds = log.read_text().splitlines() if log.exists() else []
    print(
        f"\nsecond process: {second['first_step_s']} s (first: {first['first_step_s']} s); "
        f"{len(builds)} compiler runs rebuilding cached C++ source"
    )


def test_sharing_stops_and_torch_switches_stay_torchs(tmp_path: Path) -> None:
    """An explicit TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=0 stays off; stop() restores."""
    script = (
        "import fcache, torch._inductor.config as c, torch._functorch.config as f\n"
        "from torch._inductor import remote_cache as r\n"
        "s = fcache.share_torch_compile('unix:/nonexistent.sock')\n"
        "assert c.fx_graph_remote_cache is False, c.fx_graph_remote_cache\n"
        "assert f.enable_remote_autograd_cache is True\n"
        "assert r.RemoteFxGraphCache.backend_override_cls is not None\n"
        "assert fcache.share_torch_compile('unix:/nonexistent.sock') is s\n"
        "s.stop()\n"
        "assert f.enable_remote_autograd_cache is None\n"
        "assert r.RemoteFxGraphCache.backend_override_cls is None\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] = "0"
    env.pop("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    proc = fresh.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
