"""Inductor's CPU code for a layer norm's backward piece (Swin, bfloat16) with a transposed
input returns NaN and infinity where eager returns finite values (torch 2.13.0 CPU, found
by fcache's validation, which refused the kernel and ran the region in eager). Standalone:
plain torch.compile, no fcache. Prints the count of non-finite values in each output."""

import torch


def f(x, mean, rstd, w, b):  # the region as fcache captured it (canonical text, renamed)
    y = ((x.contiguous().float() - mean) * rstd * w + b).to(torch.bfloat16).clone()
    w32 = w.float().contiguous()
    xhat = (x.float().contiguous() - mean.to(torch.bfloat16)) * rstd.to(torch.bfloat16)
    return y, w32, xhat, rstd.to(torch.bfloat16) / 256


g = torch.Generator().manual_seed(0)
x = torch.randn(2, 256, 1024, generator=g).to(torch.bfloat16).transpose(1, 2)  # (2,1024,256), strides (262144,1,1024)
mean, rstd = torch.randn(2, 1024, 1, generator=g), torch.randn(2, 1024, 1, generator=g)
w, b = (torch.randn(256, generator=g).to(torch.bfloat16) for _ in range(2))
eager = f(x, mean, rstd, w, b)
compiled = torch.compile(f, fullgraph=True)(x, mean, rstd, w, b)
print("torch", torch.__version__)
for i, (e, c) in enumerate(zip(eager, compiled)):
    print(f"output {i}: non-finite eager {int((~e.isfinite()).sum())}, compiled {int((~c.isfinite()).sum())}")
