import json
import time

import torch

from fcache.engine.matmuls import pad2d, unpadded_mm

torch.manual_seed(0)
d, v, m = 1024, 50257, 4096
bf = dict(device="cuda", dtype=torch.bfloat16)
W = torch.randn(v, d, **bf)
X = torch.randn(m, d, **bf)
G = torch.randn(m, v, **bf)


def t(f, n=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return round((time.perf_counter() - s) / n * 1e3, 3)


r = {}
r["fwd_unpadded"] = t(lambda: torch.mm(X, W.t()))
r["fwd_padded_fcache"] = t(lambda: unpadded_mm(X, pad2d(W, 7, 0).t(), 0, 7))
r["fwd_padded_noncontig_out"] = t(lambda: torch.mm(X, pad2d(W, 7, 0).t())[:, :v])
r["dX_unpadded"] = t(lambda: torch.mm(G, W))
Gp = pad2d(G, 0, 7)
r["dX_padded_incl_pad"] = t(lambda: unpadded_mm(pad2d(G, 0, 7), pad2d(W, 7, 0), 0, 0))
r["dX_padded_mm_only"] = t(lambda: torch.mm(Gp, pad2d(W, 7, 0)))
r["dW_unpadded"] = t(lambda: torch.mm(G.t(), X))
r["dW_padded_mm_only"] = t(lambda: unpadded_mm(Gp.t(), X, 7, 0))
r["pad_g"] = t(lambda: pad2d(G, 0, 7))
Wt = W.t()
r["pad_Wt_transposed_base"] = t(lambda: pad2d(Wt.t().t(), 0, 7).t())  # transposed copy as before
r["pad_W_direct"] = t(lambda: pad2d(W, 7, 0))
print(json.dumps(r))
