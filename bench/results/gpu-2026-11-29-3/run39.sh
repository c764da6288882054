#!/bin/bash
# GPU call 39 (1 H200): CUDA graphs recorded and replayed per generate call, and whether the
# static cache is new at each call: reduce-overhead against fcache's (issue #43).
set -u
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
timeout 150 python3 .gpu/cg_count.py ro 2>&1 | grep "call " > $OUT/cg-count.txt
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gc timeout 150 python3 .gpu/cg_count.py fcg 2>&1 | grep "call \|Error\|error" | head -20 >> $OUT/cg-count.txt
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gc timeout 100 python3 .gpu/cg_count.py fcg 2>&1 | grep "call \|Error\|error" | sed 's/^fcg/fcg-warm/' | head -20 >> $OUT/cg-count.txt
cat $OUT/cg-count.txt
