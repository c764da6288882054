"""torch's hierarchical compilation on a tiny Hugging Face Llama, CPU: correctness and capture.

    python nested_probe.py grads LAYERS BACKEND [flat|method|class]
        one training step of torch.compile(model, backend=BACKEND) against eager, with each
        decoder layer's forward marked torch.compiler.nested_compile_region per instance
        (method), on the class (class) or not at all (flat); prints every parameter whose
        gradient differs from eager's by more than 1e-4
    python nested_probe.py time LAYERS [flat|method]
        when Dynamo hands its graph to the backend, when AOTAutograd hands over the forward
        and backward graphs (aot_autograd with no compiler: the graphs run as they are)
"""

import copy
import sys
import time
import types

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from transformers import LlamaConfig, LlamaForCausalLM


def model(layers: int, dim: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=dim, intermediate_size=2 * dim, num_attention_heads=4,
                      num_key_value_heads=4, num_hidden_layers=layers, vocab_size=100,
                      use_cache=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def mark(m: LlamaForCausalLM, how: str) -> None:
    cls = type(m.model.layers[0])
    if how == "method":  # one marked function, bound to each layer
        marked = torch.compiler.nested_compile_region(cls.forward)
        for layer in m.model.layers:
            layer.forward = types.MethodType(marked, layer)
    elif how == "class":
        cls.forward = torch.compiler.nested_compile_region(cls.forward)


def grads(layers: int, backend: str, how: str) -> None:
    m = model(layers, 64)
    ref = copy.deepcopy(m)
    mark(m, how)
    x = torch.randint(0, 100, (2, 16))
    out = torch.compile(m, backend=backend)(input_ids=x, labels=x)
    out.loss.backward()
    r = ref(input_ids=x, labels=x)
    r.loss.backward()
    print(f"{backend} {how} layers={layers} loss {out.loss.item():.6f} eager {r.loss.item():.6f}")
    bad = 0
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        d = (p.grad - q.grad).abs().max().item()
        if d > 1e-4:
            bad += 1
            print(f"  gradient of {name} differs by {d:.4g}")
    print(f"  {bad} parameters with a wrong gradient")


def timing(layers: int, how: str) -> None:
    m = model(layers, 256)
    mark(m, how)
    x = torch.randint(0, 100, (2, 64))
    t: dict[str, float] = {}

    def stamp(name):
        def compiler(gm, inputs):
            t.setdefault(name, time.perf_counter())
            return make_boxed_func(gm.forward)
        return compiler

    aot = aot_autograd(fw_compiler=stamp("forward"), bw_compiler=stamp("backward"))

    def backend(gm, inputs):
        t.setdefault("dynamo", time.perf_counter())
        return aot(gm, inputs)

    start = time.perf_counter()
    out = torch.compile(m, backend=backend)(input_ids=x, labels=x)
    out.loss.backward()
    end = time.perf_counter()
    print(f"{how} layers={layers}: Dynamo {t['dynamo'] - start:.2f} s, forward graph "
          f"{t['forward'] - start:.2f} s, backward graph {t['backward'] - start:.2f} s, "
          f"step done {end - start:.2f} s")


if __name__ == "__main__":
    if sys.argv[1] == "grads":
        grads(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "method")
    else:
        timing(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "method")
