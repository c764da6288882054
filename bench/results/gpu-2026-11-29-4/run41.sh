#!/bin/bash
# GPU call 41 (1 H200): the Inductor failure of the static-cache decode regions (issue #43), then
# the 20-length variable-length training run on an otherwise idle machine.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
FCACHE_COMPILE_WORKERS=1 FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/if timeout 200 python3 .gpu/ind_fail.py > $OUT/ind-fail.txt 2>&1; t ind-fail
grep -v "Warning\|warn(" $OUT/ind-fail.txt | grep "regions failed\|=====\|static launcher\|Error" | head -30
timeout 420 python3 -m bench.varlen --device cuda --family hf-llama --layers 4 --dim 1024 --steps 10 \
  --lengths 2048,1024,1536,512,768,1280,1792,896,640,1152,1920,384,1664,1408,1024,960,704,1856,1216,576 \
  --timeout 130 --out $OUT/h200-varlen20.json > $OUT/varlen20.txt 2>&1; t varlen
tail -40 $OUT/varlen20.txt
