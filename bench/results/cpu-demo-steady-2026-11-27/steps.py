import os, sys, time, json, resource
import torch
from fcache.examples.models import ModelConfig, build, sample_tokens
cfg = ModelConfig(family="llama", layers=2, dim=64, heads=4, vocab=256, max_seq=64)
model = build(cfg)
tokens = sample_tokens(cfg, 2, 64)
m = torch.compile(model)
from torch._dynamo.utils import counters
def step():
    model.zero_grad(set_to_none=True)
    out = m(tokens); out.float().square().mean().backward()
rows=[]
for i in range(25):
    w=time.perf_counter(); c=time.process_time(); th=time.thread_time()
    ru=resource.getrusage(resource.RUSAGE_SELF)
    step()
    ru2=resource.getrusage(resource.RUSAGE_SELF)
    rows.append((round((time.perf_counter()-w)*1e3,1), round((time.process_time()-c)*1e3,1), round((time.thread_time()-th)*1e3,1), ru2.ru_nivcsw-ru.ru_nivcsw, ru2.ru_minflt-ru.ru_minflt, counters["stats"]["unique_graphs"], torch.get_num_threads()))
for r in rows: print(r)
