#!/bin/bash
# GPU call 9 (2 GPUs): DDP's bucket programs stored (warm DDP), FSDP2 warm; then tests/gpu
# on GPU 0 beside the variable-length benchmark on GPU 1 (issue #43).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
nvidia-smi -L
python3 -c "
from torch._functorch._aot_autograd import graph_compile as g
print('_get_inner_meta', hasattr(g, '_get_inner_meta'))
from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult as R
print('wrap_post_compile', hasattr(R, 'wrap_post_compile'))
import fcache.engine.backend as b; print('loaded_meta_set', b._loaded_meta_set())"
t dist
timeout 300 python3 -m bench.distributed --nproc 2 --families hf-llama --wraps ddp,fsdp2 --layers 4 \
  --systems torch.compile,fcache --timeout 110 --budget 230 --work /tmp/d9 --out $OUT/dist9 > $OUT/dist9.txt 2> $OUT/dist9.err
tail -12 $OUT/dist9.err | cut -c1-300; cat $OUT/dist9.txt | head -40
t tests+varlen
(CUDA_VISIBLE_DEVICES=0 timeout 230 python3 -m pytest -n 4 -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_matrix.py > $OUT/gpu-tests.txt 2>&1) &
CUDA_VISIBLE_DEVICES=0 true
(CUDA_VISIBLE_DEVICES=1 timeout 235 python3 -m bench.varlen --device cuda --family hf-llama --layers 4 --dim 1024 \
  --timeout 110 --out $OUT/varlen9.json > $OUT/varlen9.txt 2> $OUT/varlen9.err) &
wait
t done
tail -8 $OUT/gpu-tests.txt; cat $OUT/varlen9.txt; tail -5 $OUT/varlen9.err | cut -c1-300
(cd /tmp && find d9 -type f -size -300k \( -name '*.txt' -o -name '*.log' -o -name '*.json' -o -name '*.err' \) | tar czf $OUT/dlogs.tgz -T - 2>/dev/null)
