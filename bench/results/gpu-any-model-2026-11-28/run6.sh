#!/bin/bash
# GPU call 6: why the float32 Llama compiles 13 for 11 unique regions (logs); where
# fcache's steady step spends its host time against torch.compile's (cProfile).
set -u
source .gpu/setup.sh  # the GPU set-up of that session (nvFuser, lmdb wheels)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
FCACHE_DIR=/tmp/f32 TORCHINDUCTOR_CACHE_DIR=/tmp/f32i FCACHE_PROGRESS=0 timeout 90 python3 -c "
import logging, runpy, sys
logging.basicConfig(level=logging.INFO)
sys.argv = ['run', '--system', 'fcache', '--layers', '2', '--family', 'llama', '--dim', '32', '--heads', '2', '--vocab', '64', '--batch', '2', '--seq', '8', '--steps', '1', '--check', '--device', 'cuda', '--executors', 'inductor,eager']
runpy.run_module('fcache.examples.run', run_name='__main__')
" > $OUT/f32.txt 2>&1
grep -i "refus\|valid\|cut\|fail\|off by\|relative" $OUT/f32.txt | cut -c1-400 | head -20
tail -1 $OUT/f32.txt | cut -c1-600
for fam in hf-falcon hf-gemma2 hf-opt; do
for sys in tc fcache; do
  FCACHE_DIR=/tmp/pf-$fam TORCHINDUCTOR_CACHE_DIR=/tmp/pfi-$fam-$sys FCACHE_PROFILE_FAMILY=$fam FCACHE_PROFILE_SIZE=512,8,32000,2,1024 \
  FCACHE_PROFILE_AUTOGRAD_THREADS=0 FCACHE_PROFILE_STEADY=$OUT/steady-$fam-$sys.txt \
    timeout 80 python3 -m bench.step_profile $sys 4 > $OUT/prof-$fam-$sys.txt 2>&1 || echo "prof $fam $sys failed"
  tail -1 $OUT/prof-$fam-$sys.txt | python3 -c "import json,sys; r=json.load(sys.stdin); print('$fam', '$sys', {k: r[k] for k in ('first_s','steady_ms','host_ms','gpu_ms_per_step','kernels_per_step')})" 2>/dev/null
done
done
