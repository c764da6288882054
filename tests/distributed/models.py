"""Models for the distributed tests, shared by the rank job (tests/distributed/rank.py) and the
placement test on captured graphs (tests/unit/frontend/test_collectives.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def llama(layers: int = 3, hidden: int = 128) -> torch.nn.Module:
    """A Hugging Face Llama with random weights (seeded), in train mode. At the default size
    it is 1.9 MB of float32: DDP with 1 MB buckets cuts it in two."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).train()


class ShardedLayer(torch.nn.Module):
    """A norm and a two-matmul MLP whose weights each rank holds a shard of (dim 0), as
    torch's traced FSDP (SimpleFSDP) shards them: all-gathered where the forward uses them
    (`_c10d_functional.all_gather_into_tensor` and a `wait_tensor` in the forward graph),
    their gradients reduce-scattered in the backward graph."""

    def __init__(self, dim: int, rank: int, world: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        up, down = torch.randn(2 * dim, dim) * 0.1, torch.randn(dim, 2 * dim) * 0.1
        self.up = torch.nn.Parameter(up.chunk(world)[rank].clone())
        self.down = torch.nn.Parameter(down.chunk(world)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = dist.group.WORLD
        up = funcol.all_gather_tensor_autograd(self.up, 0, group)
        down = funcol.all_gather_tensor_autograd(self.down, 0, group)
        h = torch.nn.functional.silu(self.norm(x) @ up.t()) * 2.0
        return x + (h @ down.t()).tanh()


class Sharded(torch.nn.Module):
    """Layers of `ShardedLayer`; the same full weights on every rank (seeded), each rank
    keeping its shard. Needs an initialized default process group."""

    def __init__(self, dim: int = 16, layers: int = 3) -> None:
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(ShardedLayer(dim, rank, world) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
