#!/usr/bin/env bash
# One device call: build + GPU tests + compute-sanitizer (small case) + bench.
# Usage on the H200: bash dosa_cupy/devrun.sh "<pytest -k expr>" "<bench shapes>"
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u | tee "$OUT/log"; git log -1 --format=%H 2>/dev/null | tee -a "$OUT/log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee -a "$OUT/log"
python3 -c "import cupy; print('cupy', cupy.__version__)" | tee -a "$OUT/log"
if [ -n "$1" ]; then
  timeout 300 python3 -m pytest -q -s tests/test_gpu.py -k "$1" 2>&1 | tee "$OUT/pytest.log" | tail -60
fi
if [ -n "$SANITIZE" ]; then
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
wl = make_gpu_workload('structured', 16, 4096, 32, seed=1)
a = (wl['q'], wl['w'], wl['k_payload'], wl['k_scale'], 256, wl['ks'], wl['ke'])
d = dosa_cupy.dense_topk(*a); i = dosa_cupy.dosa_topk(*a, buffer=16)
print('sanitizer-case ids equal', bool(cp.array_equal(d, i)))
" 2>&1 | tee "$OUT/sanitizer.log" | tail -15
fi
if [ -n "$2" ]; then
  timeout ${BENCH_TIMEOUT:-280} python3 -m dosa_cupy.bench --shapes "$2" --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
