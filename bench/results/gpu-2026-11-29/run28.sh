#!/bin/bash
# GPU call 28 (1 H200): why a cold process steps slower than a warm one (OPT, T5): 60 steady
# steps each, every thread's CPU time sampled (.gpu/sample.sh).
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
mkdir -p /tmp/s
A="--system fcache --layers 4 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --device cuda --mode train --steps 60"
for f in opt t5; do
  FCACHE_DIR=/tmp/c-$f bash .gpu/sample.sh $f-cold -- python3 -m bench.measure $A --family hf-$f; t $f-cold
  FCACHE_DIR=/tmp/c-$f bash .gpu/sample.sh $f-warm -- python3 -m bench.measure $A --family hf-$f; t $f-warm
done
FCACHE_DIR=/tmp/c-opt0 FCACHE_COMPILE_WORKERS=0 bash .gpu/sample.sh opt-cold-w0 -- python3 -m bench.measure $A --family hf-opt; t opt-cold-w0
for f in /tmp/s/*.json; do echo "== $f"; python3 -c "
import json,sys; d=json.loads(open(sys.argv[1]).read()); print(d.get('steady_step_s'), [round(x*1000,1) for x in d.get('steady_steps_s',[])], d.get('compiles'), d.get('functions_loaded'))" $f; done
tail -3 /tmp/opt-cold.err
(cd /tmp && tar czf $OUT/samples.tgz s *.err)
