"""A graph-broken tiny OPT (layer-drop: a graph break per layer), text executor, 100
training steps timed after 3: `FCACHE_DIR=D python bench/results/cpu-package-steady-2026-11-28/opt_steady.py`
twice on the same D (cold, then warm). PROF=FILE writes a cProfile of the timed steps."""
import json, sys, time, os
sys.path[:0] = ["."]  # run from the repository root
import torch, fcache
from tests.text_executor import register
from transformers import OPTConfig, OPTForCausalLM
register()
torch.set_num_threads(1)
cfg = OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                word_embed_proj_dim=32, attn_implementation="sdpa", use_cache=False,
                layerdrop=1e-9)
torch.manual_seed(0)
model = OPTForCausalLM(cfg).train()
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(model, settings=settings)
tokens = torch.randint(0, 128, (2, 8))
def step():
    compiled(input_ids=tokens).logits.float().square().mean().backward()
for _ in range(3): step()
prof = os.environ.get("PROF")
if prof:
    import cProfile, pstats
    p = cProfile.Profile(); p.enable()
t = time.perf_counter()
for _ in range(100): step()
dt = (time.perf_counter() - t) / 100
if prof:
    p.disable(); pstats.Stats(p, stream=open(prof, "w")).sort_stats("cumulative").print_stats(80)
s = fcache.stats(compiled)
print(json.dumps({"step_ms": round(dt * 1e3, 3), "loaded": s.functions_loaded}))
