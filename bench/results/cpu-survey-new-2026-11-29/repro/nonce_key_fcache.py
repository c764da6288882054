# fcache: a graph-broken model (recorded as Dynamo's package, under fcache's
# bypass_autograd_cache_key) whose two graphs AOTAutogradCache cannot key: both get the
# same nonce key, and the second graph is answered with the first one's stored program.
# Here fcache notices (the package is not stored: "AssertionError: expected size 4==2"),
# and the results stay right; in Switch Transformers the step fails (see ../README.md).
import os
import tempfile

d = tempfile.mkdtemp()
os.environ.update(FCACHE_DIR=d + "/fc", TORCHINDUCTOR_CACHE_DIR=d + "/ind", FCACHE_PROGRESS="0")
import torch
import torch.nn as nn

import fcache


class Router(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.classifier, self.act = nn.Linear(8, 4, bias=False), act

    def forward(self, x):
        self.classifier = self.classifier.to(torch.float32)  # as Switch Transformers' router
        return self.act(self.classifier(x))


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Router(torch.sigmoid), Router(torch.tanh)

    def forward(self, x):
        h = self.a(x)
        print("graph break")  # two graphs, one per router
        return self.b(h @ torch.ones(4, 8))


torch.manual_seed(0)
m, x = M(), torch.randn(2, 8)
c = fcache.jit(m)
for step in range(2):
    m.zero_grad()
    out = c(x)
    out.sum().backward()
    grad = m.b.classifier.weight.grad.clone()
    m.zero_grad()
    ref = m(x)
    ref.sum().backward()
    print(
        "step",
        step,
        "output error",
        (out - ref).abs().max().item(),
        "grad error",
        (grad - m.b.classifier.weight.grad).abs().max().item(),
    )
