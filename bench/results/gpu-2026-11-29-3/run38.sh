#!/bin/bash
# GPU call 38 (1 H200): why bench.generate's cold fcache process decodes batch 8 slower with
# CUDA graphs than the profiling script's: its logs (CUDA graphs skipped?), and the script at
# 256 new tokens a call, as bench.generate decodes.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
mkdir -p /tmp/g
FCACHE_BENCH_LOG=INFO TORCH_LOGS=perf_hints,cudagraphs timeout 150 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
  --new-tokens 256 --repeats 5 --timeout 100 --systems fcache-cg-cold --out /tmp/g/gen.json > /tmp/gen.txt 2>&1
t bench
grep "^|" /tmp/g/gen.md > $OUT/bench-gen.md; python3 -c "import json; print([r.get('calls_s') for r in json.load(open('/tmp/g/gen.json'))['results']])" >> $OUT/bench-gen.md
for f in /tmp/g/gen-logs/*; do echo "== $f $(wc -l < $f) lines"; grep -ci "skipping cudagraph\|no CUDA graph" $f; grep -i "skipping cudagraph\|no CUDA graph\|record\|recompil" $f | sort | uniq -c | sort -rn | head -12 | cut -c1-300; done > $OUT/bench-gen-logs.txt 2>&1
tail -c 20000 /tmp/g/gen-logs/* > $OUT/bench-gen-stderr-tail.txt 2>/dev/null
GEN_TOKENS=256 FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gp TORCH_LOGS=perf_hints timeout 150 python3 .gpu/gen_prof_cg.py fcg 8 2>&1 | grep -v Warning | tail -40 > $OUT/script-fcg-256.txt
t script-fcg
GEN_TOKENS=256 timeout 100 python3 .gpu/gen_prof_cg.py ro 8 2>&1 | grep -v Warning | tail -24 > $OUT/script-ro-256.txt
t script-ro
cat $OUT/bench-gen.md; cat $OUT/bench-gen-logs.txt | cut -c1-250; grep "calls\|==" $OUT/script-*.txt
