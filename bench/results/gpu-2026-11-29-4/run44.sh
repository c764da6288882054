#!/bin/bash
# GPU call 44 (1 H200): the cold start's peak memory with validations held to a byte budget
# (Gemma2 and OPT, fcache cold only; call 43 had 5.52 and 4.95 GiB against 2.08 and 1.58 warm).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
timeout 250 python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 \
  --seq 1024 --mode train --no-multiproc --systems fcache-cold,fcache-warm \
  --executors default --steps 12 --timeout 100 --budget 230 \
  --family hf-gemma2,hf-opt --out $OUT/h200-peak-memory > $OUT/peak.txt 2>&1
t matrix
grep "^| hf-" $OUT/h200-peak-memory.md | head -4 | cut -c1-300
