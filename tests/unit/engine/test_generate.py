"""Generation under fcache.jit (fcache.engine.generate; issue #43): `compiled.generate(...)`
of a tiny Hugging Face Llama gives eager's greedy tokens, compiles a bounded number of
graphs however many tokens it generates (8, then 24: nothing more), and a warm process
compiles nothing. The plain decode loop (`compiled(ids, cache=...)`) likewise.

Real compiles in fresh processes: the static regions with the text executor
(tests/text_executor.py, no C++ compiler), the graph whose cache length went dynamic with
Inductor's CPU backend (about 20 s of C++: the warm process keeps the cold one's Inductor
directory, so it does not build it again; that fcache's tiers carry a dynamic graph to a
process with an empty one is tests/unit/engine/test_dynamic.py's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fresh import run_json

_RUN = """
import inspect
import json
import torch
import fcache
import transformers
from torch._dynamo.utils import counters
from tests.text_executor import register

register()
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=128,
)
model = transformers.LlamaForCausalLM(config).eval()
model.generation_config.eos_token_id = None  # exactly max_new_tokens tokens
model.generation_config.pad_token_id = 0
ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))


# The cache's argument: `cache` from transformers 5.2x, `past_key_values` before.
forward = inspect.signature(type(model).forward).parameters
name = "cache" if "cache" in forward else "past_key_values"


def decode(fn, n):
    # The plain loop: prefill, then one token at a time into the same (static) cache.
    cache = transformers.StaticCache(config=config, max_cache_len=64)
    tokens, x = [], ids
    for _ in range(n):
        out = fn(input_ids=x, use_cache=True, **{{name: cache}})
        x = out.logits[:, -1:].argmax(-1)
        tokens.append(x)
    return torch.cat(tokens, 1)


report = {{}}
with torch.no_grad():
    for phase, lengths in {phases!r}:
        # Each phase on its own: Dynamo's caches and the sizes it saw (by code object,
        # the model's forward for all three) start afresh, as in a new process.
        torch._dynamo.reset()
        options = dict(do_sample=False)
        if phase in ("static", "forward"):  # one length for every call: shapes never change
            options.update(cache_implementation="static", max_cache_len=64)
        expected = {{n: model.generate(ids, max_new_tokens=n, **options) for n in lengths}}
        if phase == "forward":  # Hugging Face's recipe: the instance's forward compiled
            model.forward = compiled = fcache.jit(model.forward, settings=settings)
            generate = model.generate
        else:
            compiled = fcache.jit(model, settings=settings)
            generate = compiled.generate
        rows = []
        for n in lengths:
            if phase == "loop":
                same = torch.equal(decode(compiled, n), decode(model, n))
            else:
                same = torch.equal(generate(ids, max_new_tokens=n, **options), expected[n])
            stats = fcache.stats(compiled)
            rows.append({{
                "n": n, "same": same, "graphs": stats.graphs, "compiles": stats.compiles,
                "dynamic_compiled": stats.dynamic_compiled,
                "dynamic_loaded": stats.dynamic_loaded, "programs_loaded": stats.programs_loaded,
                "functions_loaded": stats.functions_loaded,
                "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            }})
        report[phase] = rows
        vars(model).pop("forward", None)
report["compiled_call"] = model._compiled_call_impl is not None
print(json.dumps(report))
"""


def _run(tmp_path: Path, name: str, phases: list[tuple[str, list[int]]]) -> dict:
    pytest.importorskip("transformers")
    return run_json(
        _RUN.format(phases=phases),
        FCACHE_DIR=str(tmp_path / "fcache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{name}"),
        FCACHE_WHOLE="1",
        OMP_NUM_THREADS="1",
    )


@pytest.mark.slow
def test_generate_compiles_a_bounded_number_of_graphs_and_nothing_when_warm(
    tmp_path: Path,
) -> None:
    """Four phases in one process, Dynamo reset between them: `compiled.generate` with a
    static cache, with a DynamicCache, the plain loop (`compiled(ids, cache=...)`) and
    `model.generate` with `model.forward = fcache.jit(model.forward)`; then a warm process
    with the same fcache directory."""
    phases = ("static", "dynamic", "loop", "forward")
    cold = _run(tmp_path, "cold", [(p, [6, 12] if p == "loop" else [8, 24]) for p in phases])
    for phase in phases:
        first, more = cold[phase]
        assert first["same"] and more["same"], (phase, cold[phase])
        assert _counts(more) == _counts(first), (phase, cold[phase])  # nothing per token
    static, dynamic, loop = (cold[p][0] for p in ("static", "dynamic", "loop"))
    # A static cache: the prefill's graph and the decode step's, static regions.
    assert static["graphs"] == 2 and static["compiles"] > 0 and static["dynamic_compiled"] == 0
    assert static["fx_misses"] == 0
    # A DynamicCache: the prefill, the first decode step (a length seen once) and, from
    # the second step, one graph with the cache's length symbolic, compiled by Inductor.
    assert dynamic["graphs"] == 3 and dynamic["dynamic_compiled"] == 1
    assert dynamic["fx_misses"] == 1
    assert loop["graphs"] == 2 and loop["dynamic_compiled"] == 0
    # `model.forward = fcache.jit(model.forward)`: the same two graphs, their regions
    # compiled in the static phase.
    forward = cold["forward"][0]
    assert forward["graphs"] == 2 and forward["compiles"] == 0
    assert not cold["compiled_call"]  # generate's compiled call is gone once it returns

    # The same fcache directory; the cold run's Inductor directory, which keeps the dynamic
    # graph's built C++ (about 20 s to build again on 2 cores; that fcache's tiers carry
    # the graph to an empty one is tests/unit/engine/test_dynamic.py's).
    warm = _run(tmp_path, "cold", [("static", [24]), ("dynamic", [24]), ("forward", [24])])
    for phase, graphs in (("static", 2), ("dynamic", 3)):
        (row,) = warm[phase]
        assert row["same"] and row["graphs"] == graphs, (phase, row)
        assert row["compiles"] == 0 and row["dynamic_compiled"] == 0, (phase, row)
        assert row["programs_loaded"] == 2, (phase, row)
    assert warm["dynamic"][0]["dynamic_loaded"] == 1
    assert warm["dynamic"][0]["fx_misses"] == 0
    # The bound method's recipe: a warm process compiles nothing either (a call with a
    # key/value cache object takes torch.compile's route, which loads the programs).
    (row,) = warm["forward"]
    assert row["same"] and row["compiles"] == 0 and row["programs_loaded"] == 2, row


def _counts(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "n"}


_ROLES = """
import inspect
import json
import torch
import transformers
import fcache
from fcache import api
from tests.text_executor import register

register()
seen = []  # [phase, kind, static inputs, mutated inputs] of every graph CUDA graphs would wrap


class Recorder:  # stands in for CUDA graphs, which capture nothing on a CPU
    def __call__(self, kind, gm, fn, roles):
        seen.append([phase, kind, list(roles.static), list(roles.mutated)])
        return fn


api._wrapper = lambda settings: Recorder
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, max_position_embeddings=64,
)
model = transformers.LlamaForCausalLM(config).eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
options = dict(do_sample=False, max_new_tokens=4, cache_implementation="static", max_cache_len=32)
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
forward = inspect.signature(type(model).forward).parameters
name = "cache" if "cache" in forward else "past_key_values"


def loop(fn):  # the plain decode loop, into a static cache of the caller's
    cache = transformers.StaticCache(config=config, max_cache_len=32)
    x, tokens = ids, []
    for _ in range(4):
        x = fn(input_ids=x, use_cache=True, **{name: cache}).logits[:, -1:].argmax(-1)
        tokens.append(x)
    return torch.cat(tokens, 1)


same = {}
with torch.no_grad():
    expected = model.generate(ids, **options)
    for phase in ("generate", "loop", "method"):
        torch._dynamo.reset()
        if phase == "generate":
            same[phase] = torch.equal(
                fcache.jit(model, settings=settings).generate(ids, **options), expected)
        elif phase == "loop":
            same[phase] = torch.equal(loop(fcache.jit(model, settings=settings)), loop(model))
        else:  # Hugging Face's recipe: the instance's forward compiled, generate as usual
            model.forward = fcache.jit(model.forward, settings=settings)
            same[phase] = torch.equal(model.generate(ids, **options), expected)
            del model.forward
print(json.dumps({"seen": seen, "same": same}))
"""


def test_a_static_caches_tensors_are_static_inputs_of_the_decode_graph(tmp_path: Path) -> None:
    """The decode step writes into the static cache (keys, values, its length): CUDA graphs
    replay a graph only if every input it writes to is static (a fixed address). Transformers
    marks a static cache's tensors so only outside a trace, and under fcache the prefill,
    which creates them, is traced: unmarked, the H200 ran every decode step without a CUDA
    graph ("mutated inputs"). fcache marks them before each call of a module or a module's
    bound method it compiled: `compiled.generate`, the plain loop, and `model.forward =
    fcache.jit(model.forward)` (which, before, took no whole stored function and no marks)."""
    pytest.importorskip("transformers")
    report = run_json(
        _ROLES,
        FCACHE_DIR=str(tmp_path / "fcache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        FCACHE_CUDA_GRAPHS="1",
    )
    assert report["same"] == {"generate": True, "loop": True, "method": True}
    for phase in ("generate", "loop", "method"):
        writing = [(k, st, m) for p, k, st, m in report["seen"] if p == phase and m]
        assert writing, (phase, report["seen"])  # the decode step writes into the cache
        for kind, static, mutated in writing:
            assert set(mutated) <= set(static), (phase, kind, static, mutated)


def test_static_caches_are_marked_and_other_arguments_left_alone() -> None:
    """What fcache marks in front of every call: a static cache's tensors, and nothing of
    other arguments, whose own `__getattr__` may raise anything (it raised from fcache's
    call, before any compile)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from fcache.engine.static_caches import mark_static_caches

    class Strange:
        def __getattr__(self, name: str) -> object:
            raise KeyError(name)

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    static = transformers.StaticCache(config=config, max_cache_len=8)
    dynamic = transformers.DynamicCache(config=config)
    for cache in (static, dynamic):  # their layers' tensors made, as a first call makes them
        for layer in range(2):
            cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), layer)
    mark_static_caches((torch.zeros(1), Strange()), {"cache": static, "other": dynamic})
    for layer in static.layers:
        assert layer.keys._dynamo_static_input_type == "unguarded"
        assert layer.values._dynamo_static_input_type == "unguarded"
    for layer in dynamic.layers:  # a DynamicCache's tensors are new at every step
        assert not hasattr(layer.keys, "_dynamo_static_input_type")


def test_a_static_caches_tensors_made_in_its_first_call_are_marked_at_the_next() -> None:
    """A static cache's layers are made in its first call (the prefill): the call before
    finds nothing to mark, the next marks them, and from then on the cache is not walked
    again at every decode step (a different cache still is)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from fcache.engine import static_caches

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    first, second = (transformers.StaticCache(config=config, max_cache_len=8) for _ in range(2))
    static_caches.mark_static_caches((), {"cache": first})  # before its first call: empty
    for cache in (first, second):
        for layer in range(2):
            cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), layer)
    for _ in range(2):
        static_caches.mark_static_caches((), {"cache": first})
    assert static_caches._marked().get(first) is True
    assert all(layer.keys._dynamo_static_input_type == "unguarded" for layer in first.layers)
    assert static_caches._marked().get(second) is None  # not yet seen
    static_caches.mark_static_caches((second,), {})
    assert all(layer.values._dynamo_static_input_type == "unguarded" for layer in second.layers)
