#!/bin/bash
# GPU call 35 (1 H200): Swin after 72bea9a (index samples) against torch.compile, then tests/gpu.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
M="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 100"
timeout 300 python3 -m bench.run $M --budget 280 --work /tmp/wa --out $OUT/matrix --family hf-swin,hf-modernbert > /tmp/ma.txt 2>&1
t matrix
timeout $(( 570 - ($(date +%s) - T0) )) python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/tests-gpu.txt 2>&1
t tests
grep -h "could not\|cut by op\|validation" /tmp/wa/logs/*/stderr.txt 2>/dev/null | cut -c1-250 | head -20 > $OUT/val.txt
(cd /tmp && tar czf $OUT/data.tgz ma.txt wa/logs 2>/dev/null)
grep "^|" $OUT/matrix.md | head -30; tail -3 /tmp/ma.txt; cat $OUT/val.txt; tail -5 $OUT/tests-gpu.txt
