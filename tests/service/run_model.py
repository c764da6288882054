"""One 'rank' for the end-to-end tests: compile a tiny decoder through fcache.jit against a
server, run a training step, compare with eager, and print a JSON summary on stdout.

    python -m tests.service.run_model SERVER CACHE_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import fcache
from fcache.cache.lmdb import LmdbStore
from fcache.examples.models import ModelConfig, build, sample_tokens

TINY = ModelConfig(layers=2, dim=32, heads=2, vocab=64, max_seq=16)


def step(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(tokens)
    out.float().pow(2).mean().backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def main(server: str, cache_dir: Path, key_file: Path | None = None) -> dict[str, object]:
    settings = fcache.Settings(
        cache_dir=cache_dir,
        server=server,
        # The node's one key (docs/trust.md), else the cache directory's own.
        signing_key_file=key_file,
        executors=("inductor",),
        compile_workers=1,
        server_timeout_s=10.0,
        progress=False,
    )
    tokens = sample_tokens(TINY, batch=2, seq=16)
    compiled = fcache.jit(build(TINY), settings=settings)
    out, grads = step(compiled, tokens)
    ref_out, ref_grads = step(build(TINY), tokens)
    correct = torch.allclose(out, ref_out, rtol=1e-4, atol=1e-5) and all(
        torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(grads, ref_grads, strict=True)
    )
    stats = fcache.stats(compiled)
    # What `fcache stats` would show for this process's local cache: every tier's
    # counters, flushed at the end of each compiled graph.
    store = LmdbStore(cache_dir, settings.max_bytes)
    persisted = {tier: c.to_dict() for tier, c in store.read_stats().items()}
    store.close()
    return {
        "correct": correct,
        "compiles": stats.compiles,
        "unique_regions": stats.unique_regions,
        "fallbacks": stats.fallbacks,
        "hits": dict(stats.hits),
        "misses": dict(stats.misses),
        "tiers": persisted,
    }


if __name__ == "__main__":
    key = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), key)), flush=True)
