#!/bin/bash
# GPU call 15 (2 GPUs): GPU 0: where the steady step goes (bench.step_profile, Qwen2 and T5 at
# the matrix's size: torch.compile, fcache cold process, fcache warm process), and the graph
# breaks of OPT and Whisper on CUDA. GPU 1: the matrix again for the rows under the bar.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
A="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 100 --keep-work"
t start
(CUDA_VISIBLE_DEVICES=1 FCACHE_BENCH_LOG=INFO timeout 545 python3 -m bench.run $A --budget 510 --work /tmp/wb --out /tmp/md \
  --family hf-t5,hf-bert,hf-qwen2-moe,hf-falcon,hf-bigcode > /tmp/md.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=0 FCACHE_PROFILE_SIZE=512,8,32000,2,1024 FCACHE_PROFILE_STEPS=20
 for fam in hf-qwen2 hf-t5; do
   export FCACHE_PROFILE_FAMILY=$fam FCACHE_DIR=/tmp/sp-$fam TORCHINDUCTOR_CACHE_DIR=/tmp/spi-$fam
   for sys in tc fcache fcache eager; do
     echo "== $fam $sys $(date +%s)"; timeout 100 python3 -m bench.step_profile $sys 4 2>/tmp/sp-err.txt | tail -1 | cut -c1-1500
     grep -E "cut by op|could not" /tmp/sp-err.txt | head -3
   done
 done > $OUT/steady.txt 2>&1
 for fam in hf-opt hf-whisper; do
   echo "== $fam" >> $OUT/breaks.txt
   FCACHE_DIR=/tmp/gb-$fam TORCH_LOGS=graph_breaks timeout 60 python3 -m bench.measure --system fcache --family $fam --mode train \
     --layers 4 --device cuda --steps 2 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --dtype bfloat16 2>&1 \
     | grep -v "compiled a region" | grep -B2 -A14 -i "graph break" | head -60 >> $OUT/breaks.txt
 done) &
wait
t done
cp /tmp/md.json /tmp/md.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/logs.tgz wb/logs md.txt 2>/dev/null)
cut -c1-600 $OUT/steady.txt; head -c 3000 $OUT/breaks.txt
grep -h "^|" /tmp/md.md | head -30
