"""One rank of the distributed benchmark (`python -m bench.distributed`), as torchrun starts it:

    torchrun --standalone --nproc-per-node N -m bench.dist_rank --system fcache --wrap ddp \\
        --family hf-llama --layers 16 --device cuda --out DIR ...

Joins the process group torchrun describes (NCCL on CUDA, one GPU per local rank; gloo on
the CPU), builds the model (bench/hf.py, the same weights on every rank, this rank's own
tokens), wraps and compiles it as users are told to:

- ddp: the module compiled, then wrapped, `DDP(torch.compile(model))` /
  `DDP(fcache.jit(model))` (PyTorch's "Where to apply torch.compile?": compile the inner
  module; Dynamo still cuts the graphs at DDP's buckets);
- fsdp2: every layer and the root `fully_shard`ed, then the root compiled (FSDP2's hooks
  run outside the graphs, between them).

All ranks pass a barrier before the compile call, so that they start together. Then it
times the first step (start_s: the compile call, and DDP's construction after it, to the
end of the first step; FSDP2's sharding comes before the barrier) and the steady steps,
and writes DIR/rank<RANK>.json: the times, the wall clock at the end of the first step
(the spread across ranks is computed from it), the compiler's counters
(fcache: compiles, unique regions and their keys, per tier hits; torch.compile:
Inductor's graph compiles and cache hits), and with --check the loss and gradient errors
of one more step against the same job without compiling.

A step is a forward, a loss (the logits' mean square, in float32) and a backward; the
weights do not change, so every step computes the same thing. With --fcache-root, each
rank keeps its local cache in ROOT/rank<LOCAL_RANK> (the node's fcache-server then is
what the ranks share).

Diagnostics: FCACHE_BENCH_LOG=INFO (or DEBUG) logs what the systems log, as in
bench.measure; FCACHE_BENCH_PROFILE=DIR writes a file there, a cProfile of the
compile call and the first step (the 60 costliest calls by cumulative time), named by
family, wrap, system, the --out folder's name and the rank; the rank's report then says
`profiled` (its first step's times include cProfile's cost).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from bench import hf
from bench.measure import _blocks
from fcache.examples.run import DTYPES

SYSTEMS = ("eager", "torch.compile", "fcache")
WRAPS = ("ddp", "fsdp2")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--wrap", choices=WRAPS, required=True)
    p.add_argument("--family", choices=hf.FAMILIES, default="hf-llama")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=10, help="steady steps after the first")
    p.add_argument("--executors", default=None, help="fcache executors, e.g. inductor,eager")
    p.add_argument("--backend", default="inductor", help="torch.compile's backend")
    p.add_argument("--fcache-root", type=Path, default=None, help="per-rank local caches")
    p.add_argument("--check", action="store_true", help="compare one step with eager")
    p.add_argument("--out", type=Path, required=True)
    return p


def _device(args: argparse.Namespace, local_rank: int) -> torch.device:
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _shard(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2: every layer and the root `fully_shard`ed, before the compile call (and before
    the clock starts); nothing for DDP, which wraps the compiled module (`_wrapped`)."""
    if args.wrap != "fsdp2":
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _wrapped(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> Any:
    """The (sharded) model compiled by `args.system`, and wrapped in DDP for `ddp`."""
    if args.wrap == "fsdp2":
        return _compiled(args, model)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(_compiled(args, model), device_ids=ids)


def _compiled(args: argparse.Namespace, model: torch.nn.Module) -> Any:
    if args.system == "torch.compile":
        return torch.compile(model, backend=args.backend)
    if args.system == "fcache":
        import fcache

        names = tuple(args.executors.split(",")) if args.executors else None
        if names and "text" in names:
            # The test suite's executor (tests/text_executor.py), for the CPU smoke run:
            # it stores and loads real artifacts, so compiles and their sharing are
            # counted, without a compiler's cost.
            from tests.text_executor import register

            register()
        return fcache.jit(model, executors=names)
    return model


def _step(model: Callable[..., Any], params: torch.nn.Module, inputs: dict[str, Any]) -> Any:
    params.zero_grad(set_to_none=True)
    out = model(**inputs)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    loss = logits.float().square().mean()
    loss.backward()
    return loss.detach()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _counters(args: argparse.Namespace, wrapped: Any) -> dict[str, Any]:
    """fcache's counters (and its region keys), or Inductor's graph compiles."""
    if args.system == "fcache":
        import fcache

        compiled = wrapped.module if args.wrap == "ddp" else wrapped  # DDP(fcache.jit(model))
        stats = fcache.stats(compiled)
        keys = sorted(compiled._fcache_record.keys)  # distinct region keys: stats counts them
        return {**stats.to_dict(), "region_keys": keys}
    if args.system == "torch.compile":
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        return {
            "compiles": inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"],
            "graph_cache_hits": inductor["fxgraph_cache_hit"],
        }
    return {}


def _check(args: argparse.Namespace, wrapped: Any, model: torch.nn.Module, inputs: Any) -> Any:
    """One more step against the same job without compiling, on the same weights: the loss
    difference and the largest gradient difference (max abs, in float32)."""
    device = next(model.parameters()).device
    reference = _build(args, device)
    _shard(args, reference, device)
    eager = _wrapped(argparse.Namespace(**{**vars(args), "system": "eager"}), reference, device)
    got, expected = _step(wrapped, model, inputs), _step(eager, reference, inputs)
    error = 0.0
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        if q.grad is None:
            continue
        if p.grad is None:  # a gradient eager computes and the compiled job did not
            error = float("inf")
            continue
        a, b = _full(p.grad), _full(q.grad)
        error = max(error, float((a.float() - b.float()).abs().max()))
    return {"loss_error": float((got.float() - expected.float()).abs()), "max_grad_error": error}


def _full(grad: torch.Tensor) -> torch.Tensor:
    """A gradient whole: FSDP2's is a DTensor shard (gathered, a collective on all ranks)."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _build(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    model = hf.build(args.family, args.layers, args.dim, args.heads, args.vocab, args.seq)
    return model.to(device=device, dtype=DTYPES[args.dtype])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if args.fcache_root is not None:
        os.environ["FCACHE_DIR"] = os.fspath(args.fcache_root / f"rank{local_rank}")
    device = _device(args, local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model = _build(args, device)
    found = hf.inputs(args.family, model, args.batch, args.seq, torch.Generator().manual_seed(rank))
    dtype = DTYPES[args.dtype]
    inputs = {
        k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        for k, v in found.items()
    }
    _shard(args, model, device)
    dist.barrier()  # the ranks start together, as a job's ranks do after their set-up
    with _profiled(f"{args.family}-{args.wrap}-{args.system}-{args.out.name}-rank{rank}"):
        start = time.perf_counter()
        wrapped = _wrapped(args, model, device)
        wrap_s = time.perf_counter() - start
        first_start = time.perf_counter()
        _step(wrapped, model, inputs)
        _sync(device)
        end = time.perf_counter()
    first_done = time.time()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        _step(wrapped, model, inputs)
        _sync(device)
        times.append(time.perf_counter() - t)
    result: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": dist.get_world_size(),
        "start_s": round(end - start, 4),
        "wrap_s": round(wrap_s, 4),
        "first_step_s": round(end - first_start, 4),
        "first_step_done_unix": first_done,
        "steady_step_s": round(statistics.median(times), 6) if times else None,
        "steady_steps_s": [round(t, 6) for t in times],
        "torch": torch.__version__,
        **_counters(args, wrapped),
    }
    if os.environ.get("FCACHE_BENCH_PROFILE"):
        result["profiled"] = True
    if device.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    if args.check:
        result.update(_check(args, wrapped, model, inputs))
    return result


@contextlib.contextmanager
def _profiled(name: str) -> Any:
    """Under cProfile where FCACHE_BENCH_PROFILE names a directory (see the docstring)."""
    folder = os.environ.get("FCACHE_BENCH_PROFILE")
    if not folder:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.txt").write_text(text.getvalue())


@record  # a rank's traceback reaches torchrun's summary (and the benchmark's error line)
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if level := os.environ.get("FCACHE_BENCH_LOG"):
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        result = measure(args)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"rank{result['rank']}.json"
        path.write_text(json.dumps(result, default=str))
        # No rank tears its process group down while another is still in a collective
        # (gloo then fails the slower rank with "connection closed by peer").
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
