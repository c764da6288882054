#!/bin/bash
# GPU call 42 (1 H200): after the CPU-scalar fix: batch-8 generation with CUDA graphs against
# reduce-overhead, two rounds (issue #43); tests/gpu.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
for r in 1 2; do
  timeout 200 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
    --new-tokens 256 --repeats 5 --timeout 100 --systems torch.compile-ro,fcache-cg-cold,fcache-cg-warm --out $OUT/gen-b8-r$r.json > $OUT/gen8-$r.txt 2>&1
  t round $r
  grep -h "could not compile\|cut by op" $OUT/gen-b8-r$r-logs/* | sort | uniq -c | head
  rm -rf $OUT/gen-b8-r$r-logs
done
grep "^|" $OUT/gen-b8-r*.md; tail -2 $OUT/gen8-1.txt $OUT/gen8-2.txt
timeout $(( 580 - ($(date +%s) - T0) )) python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/tests-gpu.txt 2>&1
t tests; tail -15 $OUT/tests-gpu.txt
