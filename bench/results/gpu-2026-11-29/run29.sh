#!/bin/bash
# GPU call 29 (1 H200): issue #43's generation against torch.compile's default and
# Transformers' reduce-overhead decode compile, batch 1 then batch 8.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
S=torch.compile,torch.compile-ro,fcache-cold,fcache-warm,fcache-cg-cold,fcache-cg-warm
for b in 1 8; do
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -lt 60 ] && break
  timeout $left python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch $b --prompt 128 \
    --new-tokens 256 --timeout 120 --systems $S --out $OUT/gen-b$b.json > /tmp/gen$b.txt 2>&1
  t batch-$b
done
(cd /tmp && tar czf $OUT/logs.tgz gen*.txt 2>/dev/null)
grep "^|" $OUT/gen-b*.md | cut -c1-260; tail -5 /tmp/gen1.txt /tmp/gen8.txt | cut -c1-300
