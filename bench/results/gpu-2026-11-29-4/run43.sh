#!/bin/bash
# GPU call 43 (1 H200): the two tests/gpu tests the fork server broke, then issue #41's four rows
# (Gemma2, OPT, Falcon, GPT-BigCode) on the matrix command, nothing else on the machine.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh >/dev/null 2>&1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t start
timeout 150 python3 -m pytest -n 2 -q -p no:cacheprovider "tests/gpu/test_inductor.py::test_bfloat16_step_matches_eager_within_bf16_tolerance" \
  "tests/gpu/test_cudagraphs.py::test_parameters_are_read_in_place_and_a_warm_process_replays_its_stored_function" \
  "tests/gpu/test_inductor.py::test_a_cpu_scalar_input_of_a_cuda_region_compiles_as_one" > $OUT/tests-gpu-3.txt 2>&1
t tests; tail -3 $OUT/tests-gpu-3.txt
timeout $(( 585 - ($(date +%s) - T0) )) python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 --vocab 32000 --batch 2 \
  --seq 1024 --mode train --no-multiproc --systems eager,torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
  --executors default --steps 12 --timeout 100 --budget $(( 570 - ($(date +%s) - T0) )) \
  --family hf-gemma2,hf-opt,hf-falcon,hf-bigcode --out $OUT/h200-matrix-four > $OUT/matrix.txt 2>&1
t matrix
du -sh $OUT/* | sort -h | tail -3
tail -30 $OUT/matrix.txt | cut -c1-400
