#!/bin/bash
# GPU call 36 (1 H200): where ModernBERT's steady step differs from torch.compile's (kernels,
# launches, host time; cold and warm fcache processes), then every kernel of a batch-8
# decode token with CUDA graphs, reduce-overhead against fcache's (issue #43).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
t start
(n=0; export FCACHE_PROFILE_SIZE=512,8,32000,2,1024 FCACHE_PROFILE_STEPS=20 FCACHE_PROFILE_FAMILY=hf-modernbert
 export FCACHE_DIR=/tmp/sp-f TORCHINDUCTOR_CACHE_DIR=/tmp/spi
 for sys in tc fcache fcache tc; do
   n=$((n+1)); echo "== $sys $n"
   FCACHE_PROFILE_KERNELS=$OUT/mb-kernels-$sys-$n.json timeout 120 python3 -m bench.step_profile $sys 4 2>/tmp/sp-err-$n.txt | tail -1 | cut -c1-1800
   grep -E "cut by op|could not|fallback" /tmp/sp-err-$n.txt | head -3
 done) > $OUT/modernbert-steady.txt 2>&1
t modernbert
timeout 120 python3 .gpu/gen_prof_cg.py ro 8 $OUT/decode-kernels-ro.json 2>&1 | grep -v Warning | tail -32 >> $OUT/genprof.txt
t ro
FCACHE_CUDA_GRAPHS=1 FCACHE_DIR=/tmp/gp timeout 120 python3 .gpu/gen_prof_cg.py fcg 8 $OUT/decode-kernels-fcg.json 2>&1 | grep -v Warning | tail -32 >> $OUT/genprof.txt
t fcg
cat $OUT/modernbert-steady.txt | cut -c1-700; cut -c1-160 $OUT/genprof.txt
