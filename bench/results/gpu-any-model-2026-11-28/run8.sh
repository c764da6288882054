#!/bin/bash
# GPU call 8 (2 GPUs): Gemma2 warm after pickling outside the fake mode; then the first
# DDP/FSDP2 jobs through fcache on GPUs (issue #44).
set -u
source .gpu/setup.sh  # the GPU set-up of that session (nvFuser, lmdb wheels)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
nvidia-smi -L
A="--family hf-gemma2 --layers 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --dtype bfloat16 --device cuda --steps 10"
for role in cold warm; do
  CUDA_VISIBLE_DEVICES=0 FCACHE_BENCH_LOG=INFO FCACHE_DIR=/tmp/g2c TORCHINDUCTOR_CACHE_DIR=/tmp/g2i-$role timeout 70 python3 .gpu/dbg_pickle.py --system fcache $A > $OUT/gemma2-$role.json 2> $OUT/gemma2-$role.err
  tail -1 $OUT/gemma2-$role.json | python3 -c "import json,sys; r=json.load(sys.stdin); print('gemma2', '$role', r['start_s'], r['steady_step_s'], 'whole', r.get('functions_loaded'), 'programs', r.get('programs_loaded'))"
done
grep -h "not stored whole\|PICKLE-IN-MODE\|unable to serialize" $OUT/gemma2-*.err | cut -c1-250 | sort | uniq -c | head
timeout 330 python3 -m bench.distributed --nproc 2 --families hf-llama --wraps ddp,fsdp2 --layers 4 \
  --systems torch.compile,fcache --timeout 120 --budget 250 --work /tmp/d8 --out $OUT/dist2 > $OUT/dist2.txt 2> $OUT/dist2.err
tail -25 $OUT/dist2.err | cut -c1-300
(cd /tmp && find d8 -type f -size -300k \( -name '*.txt' -o -name '*.log' -o -name '*.json' -o -name '*.err' -o -name '*.out' \) | tar czf $OUT/dlogs.tgz -T - 2>/dev/null)
