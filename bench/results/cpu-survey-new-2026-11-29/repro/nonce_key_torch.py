# torch alone: AOTAutogradCache's nonce key (bypass_autograd_cache_key) repeats, and a
# second graph is answered with the first graph's compiled code.
import os, tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch, torch.nn as nn


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        # Switch Transformers' router does this: traced as TensorBase.set_, which
        # AOTAutogradCache cannot key (AttributeError in check_cacheable)
        self.classifier = self.classifier.to(torch.float32)
        return self.classifier(x).softmax(-1)


m = Router()
f = torch.compile(m, dynamic=False)
with torch._functorch.config.patch(
    bypass_autograd_cache_key=True, force_non_lazy_backward_lowering=True
):
    a = f(torch.randn(2, 8))
    b = f(torch.randn(3, 5, 8))  # another graph (another rank): must recompile
print("shapes", a.shape, b.shape)
from torch._dynamo.utils import counters

print(dict(counters["aot_autograd"]))
