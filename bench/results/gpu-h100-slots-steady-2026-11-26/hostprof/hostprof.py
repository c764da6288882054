"""Host cost per step: whole model vs blocks, on a size small enough that the host bounds it."""
import sys, time, torch, statistics, cProfile, pstats, io
from bench import hf
import fcache
mode, layers, family = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dev = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cuda")
torch.manual_seed(0)
model = hf.build(family, layers, 256, 4, 1024, 128).to(dev, torch.bfloat16)
tokens = torch.randint(0, 1024, (1, 128), device=dev)
fn = {"eager": lambda: model, "tc": lambda: torch.compile(model),
      "whole": lambda: fcache.jit(model), "blocks": lambda: fcache.jit(model, blocks=True)}[mode]()
def step():
    out = fn(tokens, labels=tokens)
    out.loss.backward()
for _ in range(3): step()
torch.cuda.synchronize() if dev.type == "cuda" else None
times = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(20): step()
    if dev.type == "cuda": torch.cuda.synchronize()
    times.append((time.perf_counter() - t) / 20)
print(mode, family, layers, "step ms", round(statistics.median(times) * 1e3, 3), flush=True)
pr = cProfile.Profile(); pr.enable()
for _ in range(20): step()
if dev.type == "cuda": torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print("\n".join(l[:170] for l in s.getvalue().splitlines()[:60]))
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print("\n".join(l[:170] for l in s.getvalue().splitlines()[:70]))
