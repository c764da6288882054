#!/bin/bash
# GPU call 16 (2 GPUs): GPU 0: why T5's 83-op region fails validation; the cold and warm
# processes' steady steps profiled (Qwen2); the matrix's last rows. GPU 1: generation (issue #43), batch 1.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
(export CUDA_VISIBLE_DEVICES=1
 timeout 450 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 1 --prompt 128 \
   --new-tokens 256 --timeout 100 --out /tmp/gen1.json > /tmp/gen1.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=0
 M="--mode train --layers 4 --device cuda --steps 12 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --dtype bfloat16"
 FCACHE_DIR=/tmp/t5 timeout 60 python3 -m bench.measure --system fcache --family hf-t5 $M --check > /tmp/t5.txt 2>&1
 grep -E "could not|cut by op" /tmp/t5.txt | sort | uniq -c > $OUT/misc.txt; tail -1 /tmp/t5.txt | cut -c1-900 >> $OUT/misc.txt
 export FCACHE_PROFILE_SIZE=512,8,32000,2,1024 FCACHE_PROFILE_FAMILY=hf-qwen2 FCACHE_DIR=/tmp/spq FCACHE_PROFILE_AUTOGRAD_THREADS=0
 for w in cold warm; do FCACHE_PROFILE_STEADY=/tmp/steady-$w.txt timeout 80 python3 -m bench.step_profile fcache 4 2>/dev/null | tail -1 | cut -c1-400 >> $OUT/misc.txt; done
 head -c 9000 /tmp/steady-cold.txt > $OUT/steady-cold.txt; head -c 9000 /tmp/steady-warm.txt > $OUT/steady-warm.txt
 t matrix >> $OUT/misc.txt
 FCACHE_BENCH_LOG=INFO timeout $(( 465 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 \
   --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
   --executors default --steps 12 --timeout 120 --keep-work --budget $(( 450 - ($(date +%s) - T0) )) --work /tmp/we --out /tmp/me \
   --family hf-bigcode,hf-mixtral,hf-mamba > /tmp/me.txt 2>&1) &
wait
t done
cp /tmp/me.md $OUT/ 2>/dev/null; (cd /tmp && tar czf $OUT/data.tgz me.json gen1.json gen1.txt we/logs 2>/dev/null)
cp /tmp/gen1.md $OUT/gen.md 2>/dev/null; tail -5 /tmp/gen1.txt | cut -c1-300
cat $OUT/misc.txt | cut -c1-600; cat $OUT/gen.md; grep -h "^| hf" /tmp/me.md | head -20
