#!/bin/bash
# GPU call 37 (1 H200): batch-8 generation with CUDA graphs, reduce-overhead against fcache's,
# twice in one call (issue #43; the host-bound decode moves between processes).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
for r in 1 2; do
  timeout 250 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
    --new-tokens 256 --repeats 5 --timeout 100 --systems torch.compile-ro,fcache-cg-cold,fcache-cg-warm --out $OUT/gen-b8-r$r.json > /tmp/gen8-$r.txt 2>&1
  t round $r
  rm -rf $OUT/gen-b8-r$r-logs
done
grep "^|" $OUT/gen-b8-r*.md; tail -n 2 /tmp/gen8-1.txt /tmp/gen8-2.txt
