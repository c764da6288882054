"""An embedding's backward with many indices per row (T5's relative-position bias: 1024 x
1024 indices into 32 rows, 8 heads, bf16) on the GPU: eager's embedding_dense_backward,
the decomposed accumulating index_put in eager (what a region boundary leaves to eager),
and Inductor's kernel for each (torch.compile). Median of 50 calls, ms."""
import torch
import torch._dynamo

aten = torch.ops.aten
rows, n, heads = 32, 1024, 8
grad = torch.randn(n, n, heads, device="cuda", dtype=torch.bfloat16)
idx = torch.randint(0, rows, (n, n), device="cuda")


def emb(g, i):
    return aten.embedding_dense_backward(g, i, rows, -1, False)


def put(g, i):
    z = torch.zeros(rows, heads, device="cuda", dtype=torch.float32)
    return aten.index_put(z, [i.reshape(-1)], g.reshape(-1, heads).float(), True).to(g.dtype)


def time_ms(fn):
    for _ in range(3):
        fn(grad, idx)
    torch.cuda.synchronize()
    out = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(grad, idx); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return sorted(out)[len(out) // 2]


ref = emb(grad, idx).float()
for name, fn in [("eager embedding_dense_backward", emb), ("eager index_put accumulate", put),
                 ("inductor embedding_dense_backward", torch.compile(emb)),
                 ("inductor index_put accumulate", torch.compile(put))]:
    err = (fn(grad, idx).float() - ref).abs().max().item()
    print(f"{name:36s} {time_ms(fn):8.3f} ms   max diff {err:.3g}")
