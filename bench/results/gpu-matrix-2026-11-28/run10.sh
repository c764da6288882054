#!/bin/bash
# GPU call 10 (2 GPUs): issue #41's matrix, 16 architectures, one bench.run per GPU (each
# architecture's systems run one after another on its GPU).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
A="--device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 8 --timeout 100 --keep-work"
t start
CUDA_VISIBLE_DEVICES=0 FCACHE_BENCH_LOG=INFO timeout 535 python3 -m bench.run $A --budget 500 --work /tmp/wa --out /tmp/ma \
  --family hf-gemma2,hf-opt,hf-falcon,hf-bigcode,hf-phi3,hf-mixtral,hf-t5,hf-vit > /tmp/ma.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 FCACHE_BENCH_LOG=INFO timeout 535 python3 -m bench.run $A --budget 500 --work /tmp/wb --out /tmp/mb \
  --family hf-gemma3,hf-qwen2-moe,hf-bert,hf-whisper,hf-mamba,hf-gpt-neox,hf-mistral,hf-qwen2 > /tmp/mb.txt 2>&1 &
wait
t done
cp /tmp/ma.json /tmp/ma.md /tmp/mb.json /tmp/mb.md $OUT/ 2>/dev/null
tail -c 20000 /tmp/ma.txt > $OUT/ma.txt; tail -c 20000 /tmp/mb.txt > $OUT/mb.txt
(cd /tmp && tar czf $OUT/logs.tgz wa/logs wb/logs 2>/dev/null)
grep -h "^|" /tmp/ma.md /tmp/mb.md | head -80
