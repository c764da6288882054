#!/bin/bash
# GPU call 19 (1 GPU): the package route on torch 2.11: its tests, then OPT and Whisper
# (graph-broken on CUDA) cold and warm against torch.compile.
set -u
T0=$(date +%s); t() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
export FCACHE_BENCH_COMMIT=$(cat .gpu/commit)
t breaks
timeout -s INT 100 python3 -m pytest -n 4 -q -p no:cacheprovider tests/unit/engine/test_whole_breaks.py tests/unit/engine/test_whole.py > /tmp/breaks.txt 2>&1
tail -4 /tmp/breaks.txt | cut -c1-300
t matrix
FCACHE_BENCH_LOG=INFO timeout 260 python3 -m bench.run --device cuda --depths 4 --dim 512 --heads 8 \
   --vocab 32000 --batch 2 --seq 1024 --mode train --no-multiproc --systems torch.compile-cold,torch.compile-warm,fcache-cold,fcache-warm \
   --executors default --steps 12 --timeout 100 --keep-work --budget 240 --work /tmp/wf --out /tmp/mf \
   --family hf-opt,hf-whisper > /tmp/mf.txt 2>&1
t done
cp /tmp/mf.md $OUT/ 2>/dev/null
(cd /tmp && tar czf $OUT/data.tgz mf.json mf.txt breaks.txt wf/logs 2>/dev/null)
grep "^|" /tmp/mf.md | head -30
for f in /tmp/wf/logs/*fcache*; do echo "== $f"; grep -h "fcache\." $f/stderr.txt | cut -c1-250 | sort | uniq -c | sort -rn | head -6; grep -o '"functions_loaded": [0-9]*\|"graphs": [0-9]*\|"programs_loaded": [0-9]*' $f/stdout.txt | tr '\n' ' '; echo; done
