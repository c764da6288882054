#!/bin/bash
# GPU call 31 (1 H200): tests/gpu (the CUDA-graph generation test first time), then
# issue #43's generation with the static-cache marks (9800011), batch 1 then 8.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
nvidia-smi -L; t start
timeout -s INT 230 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
t tests
S=torch.compile,torch.compile-ro,fcache-cold,fcache-warm,fcache-cg-cold,fcache-cg-warm
for b in 1 8; do
  left=$(( 565 - ($(date +%s) - T0) )); [ $left -lt 60 ] && break
  FCACHE_BENCH_LOG=INFO timeout $left python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch $b --prompt 128 \
    --new-tokens 256 --timeout 100 --systems $S --out $OUT/gen-b$b.json > /tmp/gen$b.txt 2>&1
  t batch-$b
done
(cd /tmp && tar czf $OUT/logs.tgz gen*.txt 2>/dev/null)
grep -E "passed|failed|FAILED|Error" $OUT/gpu-tests.txt | tail -8; grep "^|" $OUT/gen-b*.md | cut -c1-260; tail -3 /tmp/gen1.txt /tmp/gen8.txt | cut -c1-300
