"""Which of the batch-8 static-cache decode graph's regions Inductor fails on ("CUDA driver error:
invalid argument" while autotuning), and why: the region's inputs, its Inductor source, and the
compile rerun with the static launcher on and off, on the sample inputs and on others."""
import argparse, os, sys, traceback
sys.path.insert(0, ".")
import torch
from bench import generate as g
import fcache.executors.inductor as fi

failed = []
orig = fi.InductorExecutor.compile
def compile(self, region, device):
    try:
        return orig(self, region, device)
    except Exception as exc:
        failed.append((region, repr(exc)[:200]))
        raise
fi.InductorExecutor.compile = compile

args = argparse.Namespace(family="hf-llama", layers=4, dim=1024, heads=16, vocab=32000, prompt=128,
                          new_tokens=8, device="cuda", dtype="bfloat16")
model, ids = g.build(args, 8)
opts = dict(max_new_tokens=8, do_sample=False, use_cache=True, disable_compile=True,
            attention_mask=torch.ones_like(ids), cache_implementation="static")
import fcache
with torch.no_grad():
    fcache.jit(model).generate(ids, **opts)
print(f"{len(failed)} regions failed in-process")
from fcache.frontend.samples import inputs_for
from torch._inductor import config
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx
dev = torch.device("cuda:0")
for n, (region, why) in enumerate(failed):
    print(f"\n===== region {n}: {len(region.nodes)} ops: {why}")
    print("inputs:", [(tuple(s.shape), tuple(s.stride), str(s.dtype), s.device_type) for s in region.inputs])
    print(region.text.decode()[:6000] if isinstance(region.text, bytes) else str(region.text)[:6000])
    module = region.materialize(dev)
    example = tuple(region.example_inputs(dev))
    samples = inputs_for(region, dev)
    for ex, s in zip(example, samples):
        if ex.data_ptr() == s.data_ptr():
            print("  sample aliases example")
    graph = make_fx(module, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example)
    for static in (True, False):
        for name, inputs in (("samples", samples), ("example", list(example))):
            torch._dynamo.reset()
            try:
                with config.patch(use_static_cuda_launcher=static, force_disable_caches=True):
                    compiled = compile_fx_inner(graph, list(example))
                    compiled.current_callable([t.clone() for t in inputs])
                    torch.cuda.synchronize()
                print(f"  static launcher {static}, {name}: OK")
            except Exception as exc:
                print(f"  static launcher {static}, {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                src = getattr(locals().get("compiled"), "source_code", None)
    with config.patch(force_disable_caches=True):
        compiled = compile_fx_inner(graph, list(example))
    src = compiled.source_code
    print("----- Inductor source (kernels and call) -----")
    print(src[:20000])
