#!/bin/bash
# GPU call 14 (2 GPUs): GPU 0: tests/gpu, then Gemma2 warm starts (fcache and torch.compile,
# Triton compiles counted: 43e1cc3 + 6dac800); GPU 1: the matrix's architectures not yet run.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
A="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 100 --keep-work"
t start
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 250 python3 -m pytest -n 4 -v -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
 echo "[tests done +$(( $(date +%s) - T0 ))s]" >> $OUT/gpu-tests.txt
 export FCACHE_DIR=/tmp/wp
 TORCHINDUCTOR_CACHE_DIR=/tmp/wpi-c timeout 70 python3 .gpu/warm_prof.py hf-gemma2 fcache > /tmp/fc-cold.txt 2>&1
 TORCHINDUCTOR_CACHE_DIR=/tmp/wpi-w timeout 40 python3 .gpu/warm_prof.py hf-gemma2 fcache > $OUT/fcache-warm.txt 2>&1
 export TORCHINDUCTOR_CACHE_DIR=/tmp/tci
 timeout 70 python3 .gpu/warm_prof.py hf-gemma2 tc > /tmp/tc-cold.txt 2>&1
 timeout 40 python3 .gpu/warm_prof.py hf-gemma2 tc > $OUT/tc-warm.txt 2>&1
 head -1 /tmp/fc-cold.txt /tmp/tc-cold.txt > $OUT/colds.txt) &
(CUDA_VISIBLE_DEVICES=1 FCACHE_BENCH_LOG=INFO timeout 545 python3 -m bench.run $A --budget 510 --work /tmp/wb --out /tmp/mc \
  --family hf-mistral,hf-qwen2,hf-gpt-neox,hf-t5,hf-vit,hf-mixtral,hf-mamba > /tmp/mc.txt 2>&1) &
wait
t done
cp /tmp/mc.json /tmp/mc.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/logs.tgz wb/logs mc.txt 2>/dev/null)
grep -E "passed|failed|tests done" $OUT/gpu-tests.txt | tail -5; grep -E "FAILED|ERROR" $OUT/gpu-tests.txt | head
cat $OUT/colds.txt | cut -c1-300; head -1 $OUT/fcache-warm.txt $OUT/tc-warm.txt | cut -c1-300
grep -h "^|" /tmp/mc.md | head -40
