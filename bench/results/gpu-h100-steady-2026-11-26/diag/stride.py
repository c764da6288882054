"""The layout of torch.compile's GPT-2 logits (2 layers, bf16, batch 2 x 2048).
PYTHONPATH=. python stride.py"""

import torch

from bench import hf

m = hf.build("hf-gpt2", 2, 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
t = torch.randint(0, 50257, (2, 2048), device="cuda")
out = torch.compile(m)(t).logits
print("torch.compile logits", tuple(out.shape), out.stride(), "contiguous", out.is_contiguous())
