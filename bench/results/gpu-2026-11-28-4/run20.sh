#!/bin/bash
# GPU call 20 (1 GPU): why torch 2.11 does not store OPT's package (logs only).
set -u
source .gpu/setup.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
python3 - > /tmp/opt_cpu.txt 2>&1 <<'PY'
import os, subprocess, sys, tempfile
sys.path.insert(0, os.getcwd())
from tests.unit.engine import test_whole_breaks as t
script = t._OPT.format(root=os.getcwd()).replace("import json, sys", "import json, sys, logging; logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s'); [logging.getLogger(n).setLevel(logging.WARNING) for n in ('torch','filelock','fcache.cache','fcache.engine.compile','fcache.engine.programs')]", 1)
d = tempfile.mkdtemp()
for run in ("cold", "warm"):
    env = {**os.environ, "FCACHE_DIR": d + "/f", "FCACHE_WHOLE": "1", "TORCHINDUCTOR_CACHE_DIR": d + "/i-" + run}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=200)
    print("==", run, p.returncode, p.stdout[-500:])
    print("\n".join(l for l in p.stderr.splitlines() if "fcache.engine.whole" in l)[-4000:])
PY
M="--mode train --layers 4 --device cuda --steps 3 --dim 512 --heads 8 --vocab 32000 --batch 2 --seq 1024 --dtype bfloat16"
for r in cold warm; do
FCACHE_BENCH_LOG=DEBUG FCACHE_DIR=/tmp/opt timeout 60 python3 -m bench.measure --system fcache --family hf-opt $M > /tmp/opt_$r.txt 2>&1
done
cat /tmp/opt_cpu.txt | cut -c1-400 | tail -40
for r in cold warm; do echo "== cuda $r"; grep "fcache.engine.whole" /tmp/opt_$r.txt | cut -c1-400 | head -20; tail -1 /tmp/opt_$r.txt | grep -o '"functions_loaded": [0-9]*\|"graphs": [0-9]*\|"start_s": [0-9.]*'; done
