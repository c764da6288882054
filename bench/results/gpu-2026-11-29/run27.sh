#!/bin/bash
# GPU call 27 (1 H200): the contended embedding backward (micro-benchmark, T5's row again);
# OPT's steady step in a cold process against a warm one (cProfiles, the collector frozen).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
timeout 90 python3 bench/results/gpu-2026-11-29/embedding_backward.py > $OUT/scatter.txt 2>&1
t scatter
timeout 260 python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,fcache-cold,fcache-warm --executors default --steps 12 --timeout 110 --budget 240 --work /tmp/wt --out $OUT/t5 --family hf-t5 > /tmp/t5.txt 2>&1
t t5
export FCACHE_PROFILE_FAMILY=hf-opt FCACHE_PROFILE_SIZE=512,8,32000,2,1024
for r in cold warm; do FCACHE_DIR=/tmp/optc FCACHE_PROFILE_AUTOGRAD_THREADS=0 FCACHE_PROFILE_STEADY=$OUT/opt-steady-$r.txt TORCHINDUCTOR_CACHE_DIR=/tmp/opti-$r timeout 100 python3 -m bench.step_profile fcache 4 2>/tmp/opt-$r.err | tail -1 | sed "s/^/$r /" >> $OUT/opt.jsonl; t opt-$r; done
for r in cold warm; do FCACHE_DIR=/tmp/optd TORCHINDUCTOR_CACHE_DIR=/tmp/optj-$r timeout 100 python3 -m bench.step_profile fcache 4 2>/tmp/optp-$r.err | tail -1 | sed "s/^/plain-$r /" >> $OUT/opt.jsonl; t opt-plain-$r; done
FCACHE_DIR=/tmp/opte FCACHE_PROFILE_GC=freeze TORCHINDUCTOR_CACHE_DIR=/tmp/optk timeout 100 python3 -m bench.step_profile fcache 4 2>/tmp/optf.err | tail -1 | sed "s/^/freeze-cold /" >> $OUT/opt.jsonl
t opt-freeze
(cd /tmp && tar czf $OUT/logs.tgz t5.txt wt/logs opt-*.err optp-*.err optf.err 2>/dev/null)
cat $OUT/scatter.txt; grep "^|" $OUT/t5.md | head -8; cut -c1-400 $OUT/opt.jsonl
