#!/bin/bash
# GPU call 40 (1 H200): why fcache's cold process decodes batch 8 slower with CUDA graphs (issue #43):
# per-call cache addresses, memory, threads, a sampled and a profiled call; the Inductor failure's traceback.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
t start
timeout 150 python3 .gpu/cg_diag.py ro > $OUT/diag-ro.txt 2>&1; t ro
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gc DIAG_DEBUG=1 timeout 170 python3 .gpu/cg_diag.py fcg > $OUT/diag-fcg-cold.txt 2>&1; t cold
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gc timeout 120 python3 .gpu/cg_diag.py fcg > $OUT/diag-fcg-warm.txt 2>&1; t warm
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gc2 timeout 170 python3 .gpu/cg_diag.py fcg gc > $OUT/diag-fcg-cold-gc.txt 2>&1; t cold-gc
for f in $OUT/diag-*.txt; do echo "=== $f"; grep -v "Warning\|warn(" $f | grep "call \|sample\|profiled\|could not\|Error\|error" | cut -c1-400 | head -40; done
