"""Two ranks under torchrun (gloo, CPU) train through fcache with DDP, FSDP2 and collectives
inside the graphs, sharing one real fcache-server and one signing key (issue #44).

`torchrun --standalone --nproc-per-node 2 -m tests.distributed.rank` (tests/distributed/
rank.py says what each rank trains), twice on one server:

1. cold: each rank with its own empty cache directory. Every part's losses and gradients
   match the same job without compiling, on both ranks; together the two ranks compiled
   each unique region once (single flight through the server): their compiles add up to
   the number of distinct region keys, and the server holds every key.
2. warm: a second job, again with empty cache directories (a new node's, or a wiped one's),
   on the same server: it compiles nothing, loads from the server, and still matches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.support import key_file
from tests.service.support import ROOT, RawStub, ServerProcess, StartServer

pytest.importorskip("transformers")

RANKS = 2
JOB_TIMEOUT_S = 240
PARTS = ("ddp(jit)", "jit(ddp)", "fsdp2", "simplefsdp")
TOLERANCE = 1e-4  # relative gradient error (float32; the text executor runs ops as eager does)


def _job(server: ServerProcess, key: Path, root: Path) -> list[dict[str, Any]]:
    """One torchrun job of RANKS ranks; each rank's report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FCACHE_", "TORCH"))}
    env.update(
        FCACHE_SERVER=server.unix,
        FCACHE_SIGNING_KEY_FILE=str(key),
        TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),  # torch's own caches: empty too
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH")))),
    )
    out = root / "out"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(RANKS), "-m", "tests.distributed.rank", str(root), str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def _check_training(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert sorted(report["parts"]) == sorted(PARTS)
        for name, part in report["parts"].items():
            for got, expected in part["losses"]:
                assert got == pytest.approx(expected, rel=1e-5), (report["rank"], name)
            assert part["grad_error"] < TOLERANCE, (report["rank"], name, part["grad_error"])
            assert part["errors"] == {}, (report["rank"], name)  # the server answered
    # The ranks trained on different data: their losses differ, their DDP gradients agree.
    first, second = (r["parts"]["fsdp2"]["losses"][0][0] for r in reports)
    assert first != second


def _keys(reports: list[dict[str, Any]]) -> set[str]:
    return {key for r in reports for part in r["parts"].values() for key in part["keys"]}


def _compiles(reports: list[dict[str, Any]]) -> int:
    return sum(part["compiles"] for r in reports for part in r["parts"].values())


def test_ranks_share_one_server_compile_each_region_once_and_a_second_job_nothing(
    start_server: StartServer, tmp_path: Path
) -> None:
    key = key_file(tmp_path)
    server = start_server("--signing-key-file", str(key))

    cold = _job(server, key, tmp_path / "cold")
    _check_training(cold)
    # DDP's 1 MB buckets cut the Llama's graph in two, in both wrapping orders: two
    # forward graphs and two backward ones (the whole-function route would make one each).
    for report in cold:
        for order in ("ddp(jit)", "jit(ddp)"):
            assert report["parts"][order]["graphs"] == 4, report["parts"][order]
    keys = _keys(cold)
    assert len(keys) > 10
    for report in cold:
        for part in report["parts"].values():
            assert part["fallbacks"] == 0
    # Each unique region compiled once on the node, by one rank or the other.
    assert _compiles(cold) == len(keys), [
        {n: p["compiles"] for n, p in r["parts"].items()} for r in cold
    ]
    stub = RawStub(server.tcp)
    try:
        assert stub.find_missing(sorted(keys)) == []
        puts = stub.stats().counters["puts"]
        assert puts >= len(keys)

        warm = _job(server, key, tmp_path / "warm")
        _check_training(warm)
        assert _compiles(warm) == 0
        assert _keys(warm) == keys
        assert all(r["parts"]["fsdp2"]["hits"].get("remote", 0) > 0 for r in warm)
        assert stub.stats().counters["puts"] == puts  # nothing new to store
    finally:
        stub.close()
