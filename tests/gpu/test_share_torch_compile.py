"""share_torch_compile on CUDA: the second process's plain torch.compile, with empty local
Inductor and Triton caches, finds its graphs on fcache-server and compiles no Triton
kernel (the FX-graph entries carry them: TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE).

Inductor compiles in-process here (TORCHINDUCTOR_COMPILE_THREADS=1), so the runner's
patched triton.compile sees every kernel compile. Skipped without CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.e2e.test_share_torch_compile import run
from tests.service.support import Launcher, ServerProcess

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "server").mkdir()
    launcher = Launcher(tmp_path / "server")
    yield launcher()
    launcher.stop_all()


def test_second_process_compiles_no_triton_kernel(server: ServerProcess, tmp_path: Path) -> None:
    in_process = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    first = run(server.unix, tmp_path / "inductor-1", device="cuda", **in_process)
    assert first["triton_compiles"], "the first process compiled no Triton kernel"
    graphs = first["inductor"]["fxgraph_cache_miss"]
    assert first["remote_cache"]["RemoteFxGraphCache"]["put"] == graphs

    second = run(server.unix, tmp_path / "inductor-2", device="cuda", **in_process)
    assert second["inductor"]["fxgraph_cache_hit"] == graphs
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["aot_autograd"]["autograd_cache_hit"] == 1
    assert second["remote_cache"]["RemoteFxGraphCache"]["hit"] == graphs
    assert second["triton_compiles"] == []
    assert second["output_sum"] == first["output_sum"]
