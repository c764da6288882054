#!/bin/bash
# GPU call 25 (4 GPUs): the kernel move across GPU indices (tests/gpu/test_inductor.py with
# 4 GPUs visible), then issue #44's benchmark again, 4 ranks (as call 23), then OPT's matrix
# row alone on one GPU (is its cold process's steady step slower with nothing beside it?).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
timeout -s INT 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_inductor.py -k "another or no_tuned or loads_and_matches" > $OUT/gpu-tests.txt 2>&1
t tests
timeout 380 python3 -m bench.distributed --nproc 4 --families hf-llama --wraps ddp,fsdp2 --layers 16 \
  --systems torch.compile,fcache --timeout 150 --budget 340 --work /tmp/d25 --out $OUT/dist4 > $OUT/dist4.txt 2> $OUT/dist4.err
t dist
CUDA_VISIBLE_DEVICES=0 timeout $(( 540 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm --executors default --steps 12 --timeout 110 --family hf-opt --out $OUT/opt > /tmp/opt.txt 2>&1
t opt
tail -3 $OUT/gpu-tests.txt; grep -E "^bench: hf" $OUT/dist4.err | cut -c1-200; grep "^|" $OUT/opt.md | head -20
