"""Peak RSS of validating one region with a large bfloat16 output (a softcap on logits-sized data)."""
import resource, sys, time
sys.path.insert(0, ".")  # run from the checkout root
import torch
from fcache.engine.compile.validate import validate
from fcache.executors.eager import eager_module
from tests.graphs import capture_regions
x = torch.randn(2, 1024, 16000, dtype=torch.bfloat16)
(region,) = capture_regions(lambda f: f(x), lambda t: (t / 30).tanh() * 30)
cpu = torch.device("cpu")
fn = eager_module(region, cpu)
def boxed(args):
    return fn(*args)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.time()
v = validate(region, boxed, cpu)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = x.numel()
print(f"ok={v.ok} checked={v.checked} output {2*n/2**20:.0f} MiB bf16; peak RSS grew {(after-before)/1024:.0f} MiB during validation ({time.time()-t:.1f} s)")
