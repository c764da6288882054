#!/bin/bash
# GPU call 33 (1 H200): where a batch-8 decode step goes with CUDA graphs (reduce-overhead
# against fcache's), then issue #41: architectures never run on a GPU (Qwen3, ModernBERT, StarCoder2, Swin; as far as the budget goes).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
timeout 100 python3 .gpu/gen_prof_cg.py ro 8 2>&1 | grep -v Warning | tail -32 >> $OUT/genprof.txt
t ro
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gp timeout 100 python3 .gpu/gen_prof_cg.py fcg 8 2>&1 | grep -v Warning | tail -32 >> $OUT/genprof.txt
t fcg
M="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 100"
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m bench.run $M --budget $(( 545 - ($(date +%s) - T0) )) --work /tmp/wa --out $OUT/matrix --family hf-qwen3,hf-modernbert,hf-starcoder2,hf-swin > /tmp/ma.txt 2>&1
t matrix
(cd /tmp && tar czf $OUT/data.tgz ma.txt wa/logs 2>/dev/null)
cat $OUT/genprof.txt | cut -c1-200; grep "^|" $OUT/matrix.md | head -30; tail -3 /tmp/ma.txt
