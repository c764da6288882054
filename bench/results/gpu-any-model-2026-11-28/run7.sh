#!/bin/bash
# GPU call 7: tests/gpu after the fixes of calls 5-6 (float32 validation, entries pickled
# outside the fake mode, a declined call's key); then issue #41's rows again.
set -u
source .gpu/setup.sh  # the GPU set-up of that session (nvFuser, lmdb wheels)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
timeout 200 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1
tail -8 $OUT/gpu-tests.txt
FCACHE_BENCH_LOG=INFO timeout 345 python3 -m bench.run --device cuda --family hf-gemma2,hf-falcon,hf-opt --depths 4 \
  --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc \
  --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
  --executors default --steps 10 --budget 335 --timeout 90 --work /tmp/w7 --keep-work \
  --out $OUT/matrix4 > $OUT/matrix4.txt 2>&1
tail -3 $OUT/matrix4.txt
(cd /tmp && tar czf $OUT/logs.tgz w7/logs)
