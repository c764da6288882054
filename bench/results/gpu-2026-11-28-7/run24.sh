#!/bin/bash
# GPU call 24 (4 GPUs): where a warm fcache rank's first step goes under FSDP2 and DDP
# (2 ranks, 16 layers, cProfiles and fcache's DEBUG log); GPU 2: OPT's steady step in a cold
# process against a warm one (step_profile, cProfile of steady steps); GPU 3: T5's kernels,
# torch.compile against fcache.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
(export CUDA_VISIBLE_DEVICES=0,1
 FCACHE_BENCH_PROFILE=/tmp/prof FCACHE_BENCH_LOG=DEBUG timeout 400 python3 -m bench.distributed --nproc 2 --families hf-llama --wraps fsdp2,ddp --layers 16 \
  --systems fcache --timeout 150 --budget 360 --work /tmp/d24 --out /tmp/dist2 > /tmp/dist2.txt 2> /tmp/dist2.err
 t dist >> /tmp/t.txt) &
(export CUDA_VISIBLE_DEVICES=2 FCACHE_PROFILE_FAMILY=hf-opt FCACHE_PROFILE_SIZE=512,8,32000,2,1024 FCACHE_PROFILE_AUTOGRAD_THREADS=0
 for r in cold warm; do FCACHE_DIR=/tmp/optc FCACHE_PROFILE_STEADY=/tmp/opt-steady-$r.txt TORCHINDUCTOR_CACHE_DIR=/tmp/opti-$r timeout 120 python3 -m bench.step_profile fcache 4 > /tmp/opt-$r.json 2>/tmp/opt-$r.err; done
 FCACHE_PROFILE_STEADY=/tmp/opt-steady-tc.txt TORCHINDUCTOR_CACHE_DIR=/tmp/opti-tc timeout 120 python3 -m bench.step_profile tc 4 > /tmp/opt-tc.json 2>/tmp/opt-tc.err
 t opt >> /tmp/t.txt) &
(export CUDA_VISIBLE_DEVICES=3 FCACHE_PROFILE_FAMILY=hf-t5 FCACHE_PROFILE_SIZE=512,8,32000,2,1024
 for s in tc fcache; do FCACHE_DIR=/tmp/t5c FCACHE_PROFILE_KERNELS=/tmp/t5-kernels-$s.json TORCHINDUCTOR_CACHE_DIR=/tmp/t5i-$s timeout 150 python3 -m bench.step_profile $s 4 > /tmp/t5-$s.json 2>/tmp/t5-$s.err; done
 t t5 >> /tmp/t.txt) &
wait
cat /tmp/t.txt
cat /tmp/dist2.md 2>/dev/null | grep "^|" | head -12
grep -h "rebuilt in\|jobs in\|loaded in" /tmp/d24/logs/*warm*/stderr.txt | cut -c1-200 | head -30
for r in cold warm tc; do echo "== opt $r"; tail -1 /tmp/opt-$r.json | cut -c1-600; done
for s in tc fcache; do echo "== t5 $s"; tail -1 /tmp/t5-$s.json | cut -c1-600; done
(cd /tmp && tar czf $OUT/d24.tgz prof dist2.json dist2.md dist2.err d24/logs opt-*.json opt-*.err opt-steady-*.txt t5-*.json t5-*.err t5-kernels-*.json 2>/dev/null)
