#!/bin/bash
# GPU call 32 (1 H200): issue #43's generation with CUDA graphs at batch 8 (call 31 ran out
# of time there), then the compile path after the capture change (4778fcb): Llama and GPT-2,
# 16 layers, cold, warm and steady against torch.compile.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
FCACHE_BENCH_LOG=INFO timeout 200 python3 -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 --batch 8 --prompt 128 \
  --new-tokens 256 --timeout 90 --systems torch.compile-ro,fcache-cg-cold,fcache-cg-warm --out $OUT/gen-b8.json > /tmp/gen8.txt 2>&1
t gen-b8
rm -rf $OUT/gen-b8-logs/torch.compile-ro*
timeout $(( 570 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --family hf-llama,hf-gpt2 --mode train --depths 16 \
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --no-multiproc --steps 10 \
  --timeout 100 --budget $(( 555 - ($(date +%s) - T0) )) --work /tmp/wb --out $OUT/l16 > /tmp/l16.txt 2>&1
t l16
(cd /tmp && tar czf $OUT/logs.tgz gen8.txt l16.txt wb/logs 2>/dev/null)
grep "^|" $OUT/gen-b8.md | cut -c1-260; tail -3 /tmp/gen8.txt; grep "^|" $OUT/l16.md | head -20; tail -5 /tmp/l16.txt
