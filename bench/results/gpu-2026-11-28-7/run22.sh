#!/bin/bash
# GPU call 22 (4 GPUs, one job each): GPU 0 tests/gpu; GPUs 1-2 issue #41's matrix rows
# (OPT and Whisper after the pop_null fix, Gemma2, T5, Falcon, GPT-BigCode); GPU 3 where a
# batch-8 decode step goes (torch.compile against fcache), then bench.generate batch 8.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
nvidia-smi -L; t start
M="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 110 --keep-work"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 230 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
 t tests-done >> /tmp/t0.txt) &
(export CUDA_VISIBLE_DEVICES=1
 FCACHE_BENCH_LOG=INFO timeout 550 python3 -m bench.run $M --budget 520 --work /tmp/wa --out /tmp/ma --family hf-opt,hf-whisper,hf-gemma2 > /tmp/ma.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=2
 FCACHE_BENCH_LOG=INFO timeout 550 python3 -m bench.run $M --budget 520 --work /tmp/wb --out /tmp/mb --family hf-t5,hf-falcon,hf-bigcode > /tmp/mb.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=3
 for s in tc fcache; do FCACHE_DIR=/tmp/gp-$s timeout 150 python3 .gpu/gen_prof.py $s 8 2>&1 | grep -v Warning | tail -16 >> $OUT/genprof.txt; done
 t gen >> $OUT/genprof.txt
 timeout $(( 550 - ($(date +%s) - T0) )) python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
   --new-tokens 256 --timeout 150 --systems eager,torch.compile,fcache-cold,fcache-warm --out /tmp/gen8.json > /tmp/gen8.txt 2>&1) &
wait
t done
cp /tmp/ma.md /tmp/mb.md /tmp/gen8.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/data.tgz ma.json mb.json ma.txt mb.txt gen8.json gen8.txt t0.txt wa/logs wb/logs 2>/dev/null)
grep -E "passed|failed|FAILED|Error" $OUT/gpu-tests.txt | tail -8; cat $OUT/genprof.txt; cat $OUT/*.md | grep "^|" | head -60
