#!/bin/bash
# GPU call 26 (1 H200): tests/gpu, then issue #41's T5 and OPT rows (the contended-scatter
# rule, the cold package's contexts around compiles only).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
nvidia-smi -L; t start
timeout -s INT 220 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
t tests
M="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 110"
FCACHE_BENCH_LOG=INFO timeout $(( 570 - ($(date +%s) - T0) )) python3 -m bench.run $M --budget $(( 550 - ($(date +%s) - T0) )) --work /tmp/wa --out $OUT/matrix --family hf-t5,hf-opt > /tmp/ma.txt 2>&1
t matrix
(cd /tmp && tar czf $OUT/data.tgz ma.txt wa/logs 2>/dev/null)
grep -E "passed|failed|FAILED|Error" $OUT/gpu-tests.txt | tail -8; grep "^|" $OUT/matrix.md | head -30
