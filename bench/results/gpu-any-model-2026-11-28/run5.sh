#!/bin/bash
# GPU call 5: tests/gpu at 0fb51a2 (fixes for call 4's failures), then issue #41's rows.
set -u
source .gpu/setup.sh  # the GPU set-up of that session (nvFuser, lmdb wheels)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
(timeout 150 python3 -m compileall -q -j 8 "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')" "$(python3 -c 'import transformers, os; print(os.path.dirname(transformers.__file__))')" >/dev/null 2>&1 &)
timeout 220 python3 -m pytest -n 3 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
tail -8 $OUT/gpu-tests.txt
FCACHE_BENCH_LOG=INFO timeout 345 python3 -m bench.run --device cuda --family hf-gemma2,hf-falcon,hf-opt --depths 4 \
  --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc \
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
  --executors default --steps 10 --budget 320 --timeout 90 --work /tmp/w5 --keep-work \
  --out $OUT/matrix4 > $OUT/matrix4.txt 2>&1
tail -3 $OUT/matrix4.txt
grep -h "not stored whole\|declin\|fallback\|refused" /tmp/w5/logs/* 2>/dev/null | cut -c1-250 | sort | uniq -c | sort -rn | head -12
(cd /tmp && tar czf $OUT/logs.tgz w5/logs)
