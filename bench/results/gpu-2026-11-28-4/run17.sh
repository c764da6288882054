#!/bin/bash
# GPU call 17 (2 GPUs). GPU 0: tests/gpu; the package route's tests on torch 2.11; T5's
# validation after 22d0944 (does any region still run cut by op?); matrix rows OPT, Whisper
# (graph-broken on CUDA: package route), T5. GPU 1: generation batch 8; varlen, 20 lengths.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
(export CUDA_VISIBLE_DEVICES=1
 timeout 240 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
   --new-tokens 256 --timeout 100 --out /tmp/gen8.json > /tmp/gen8.txt 2>&1
 t varlen >> /tmp/gen8.txt
 timeout $(( 545 - ($(date +%s) - T0) )) python3 -m bench.varlen --device cuda --family hf-llama --layers 4 --dim 1024 \
   --lengths 2048,1024,1536,512,768,1280,1792,896,640,1152,1920,384,1664,1408,1024,960,704,1856,1216,576 \
   --timeout 200 --out /tmp/varlen20.json > /tmp/varlen20.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 170 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
 t breaks >> $OUT/misc.txt
 timeout -s INT 150 python3 -m pytest -n 3 -q -p no:cacheprovider tests/unit/engine/test_whole_breaks.py > /tmp/breaks.txt 2>&1
 tail -25 /tmp/breaks.txt | cut -c1-400 >> $OUT/misc.txt
 M="--mode train --layers 4 --device cuda --steps 12 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --dtype bfloat16"
 t t5 >> $OUT/misc.txt
 FCACHE_DIR=/tmp/t5 timeout 60 python3 -m bench.measure --system fcache --family hf-t5 $M --check > /tmp/t5.txt 2>&1
 grep -E "could not|cut by op|differ" /tmp/t5.txt | cut -c1-300 | sort | uniq -c >> $OUT/misc.txt; tail -1 /tmp/t5.txt | cut -c1-900 >> $OUT/misc.txt
 t matrix >> $OUT/misc.txt
 FCACHE_BENCH_LOG=INFO timeout $(( 548 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 \
   --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
   --executors default --steps 12 --timeout 110 --keep-work --budget $(( 540 - ($(date +%s) - T0) )) --work /tmp/wf --out /tmp/mf \
   --family hf-opt,hf-whisper,hf-t5 > /tmp/mf.txt 2>&1) &
wait
t done >> $OUT/misc.txt
cp /tmp/mf.md /tmp/gen8.md /tmp/varlen20.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/data.tgz mf.json mf.txt gen8.json gen8.txt varlen20.json varlen20.txt t5.txt breaks.txt wf/logs 2>/dev/null)
grep -E "passed|failed" $OUT/gpu-tests.txt | tail -2; cat $OUT/misc.txt | cut -c1-500; cat $OUT/*.md | grep "^|" | head -70
