#!/bin/bash
# GPU call 18 (2 GPUs). GPU 0: the package route's tests on torch 2.11; matrix rows OPT and
# Whisper (graph-broken on CUDA; frames with no module now left out of the package), T5.
# GPU 1: generation, batch 8: eager, torch.compile, fcache cold and warm.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
(export CUDA_VISIBLE_DEVICES=1
 timeout 520 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
   --new-tokens 256 --timeout 150 --systems eager,torch.compile,fcache-cold,fcache-warm --out /tmp/gen8.json > /tmp/gen8.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=0
 t breaks >> $OUT/misc.txt
 timeout -s INT 120 python3 -m pytest -n 3 -q -p no:cacheprovider tests/unit/engine/test_whole_breaks.py > /tmp/breaks.txt 2>&1
 tail -4 /tmp/breaks.txt | cut -c1-300 >> $OUT/misc.txt
 t matrix >> $OUT/misc.txt
 FCACHE_BENCH_LOG=INFO timeout $(( 535 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 \
   --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
   --executors default --steps 12 --timeout 110 --keep-work --budget $(( 500 - ($(date +%s) - T0) )) --work /tmp/wf --out /tmp/mf \
   --family hf-opt,hf-whisper,hf-t5 > /tmp/mf.txt 2>&1) &
wait
t done >> $OUT/misc.txt
cp /tmp/mf.md /tmp/gen8.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/data.tgz mf.json mf.txt gen8.json gen8.txt breaks.txt wf/logs 2>/dev/null)
cat $OUT/misc.txt | cut -c1-500; tail -8 /tmp/gen8.txt | cut -c1-300; cat $OUT/*.md | grep "^|" | head -50
grep -rh "package\|not stored\|left out" /tmp/wf/logs/*fcache*/stderr.txt | cut -c1-300 | sort | uniq -c | head
