#!/bin/bash
# GPU call 23 (4 GPUs): issue #44's benchmark, 4 ranks: Llama, 16 layers, hidden 1024, bf16,
# batch 2x2048 per rank, DDP and FSDP2, torch.compile against fcache, cold and warm.
set -u
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
timeout 560 python3 -m bench.distributed --nproc 4 --families hf-llama --wraps ddp,fsdp2 --layers 16 \
  --systems torch.compile,fcache --timeout 150 --budget 520 --work /tmp/d23 --out $OUT/dist4 > $OUT/dist4.txt 2> $OUT/dist4.err
tail -30 $OUT/dist4.err | cut -c1-300
(cd /tmp && find d23 -type f -size -300k \( -name '*.txt' -o -name '*.log' -o -name '*.json' -o -name '*.err' -o -name '*.out' \) | tar czf $OUT/dlogs.tgz -T - 2>/dev/null)
cat $OUT/dist4.md
