# Llama4's rotary embedding (complex multiply): the regions with a complex input run in eager.
import os, tempfile

d = tempfile.mkdtemp()
os.environ.update(FCACHE_DIR=d + "/fc", TORCHINDUCTOR_CACHE_DIR=d + "/ind", FCACHE_PROGRESS="0")
import torch, torch.nn as nn
import fcache


class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)
        freqs = torch.outer(torch.arange(8.0), torch.rand(8))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs))

    def forward(self, x):
        q = self.q(x)
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(q_ * self.freqs_cis).flatten(-2)


m, x = Rope(), torch.randn(2, 8, 16)
c = fcache.jit(m)
out = c(x)
out.sum().backward()
print("error", (out - m(x)).abs().max().item())
s = fcache.stats(c).to_dict()
print({k: s[k] for k in ("regions", "compiles", "fallbacks", "fallback_reasons", "executors")})
