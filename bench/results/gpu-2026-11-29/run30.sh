#!/bin/bash
# GPU call 30 (1 H200): is a cold process's slower steady step where it runs? OPT, 30 steady
# steps: fcache cold and warm unpinned, then everything pinned to cores 0-7 (taskset).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA|Model name)" > $OUT/host.txt; (numactl -H 2>/dev/null || true) >> $OUT/host.txt
M="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --executors default --steps 30 --timeout 100 --family hf-opt"
timeout 120 python3 -m bench.run $M --systems fcache-cold,fcache-warm --budget 110 --out $OUT/free > /tmp/free.txt 2>&1; t free
timeout 190 taskset -c 0-7 python3 -m bench.run $M --systems torch.compile-cold,fcache-cold,fcache-warm --budget 170 --out $OUT/pinned > /tmp/pinned.txt 2>&1; t pinned
cat $OUT/host.txt
for f in free pinned; do python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
for r in d['rows']: print(sys.argv[2], r['system'], r.get('start_s'), r.get('steady_step_s'), [round(x*1000,1) for x in r.get('steady_steps_s',[])])" $OUT/$f.json $f; done
