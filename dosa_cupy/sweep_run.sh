#!/usr/bin/env bash
# One device call: (optional) GPU tests + a small compute-sanitizer case, then a part of the
# `dosa bench --sweep` grid under a wall-clock cap.  Run from a `git archive` of a commit
# with its id in ./COMMIT (the device copy's .git is not the session's).
# Usage (H200): TESTS=1 FILTER=x4096x,x8192x MAXS=330 bash dosa_cupy/sweep_run.sh
#   (VARIANTS="--variant pair:screen=pair,r=6" adds same-run variants)
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
C=$(cat COMMIT 2>/dev/null || echo unknown)
L=$OUT/logs.txt
echo "[$(date -u +%T)] commit $C" | tee -a $L
if [ -n "$TESTS" ]; then
  timeout ${T_T:-240} python3 -m pytest -q -s -m gpu tests/test_gpu.py tests/test_gpu_decode.py \
    tests/test_plan_fused.py tests/test_gpu_cert.py tests/test_refine_shared.py 2>&1 \
    | tee -a $L | grep -E "passed|failed|Error" | tail -5
  timeout ${T_S:-60} compute-sanitizer --tool memcheck --print-limit 20 python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
wl = make_gpu_workload('calibrated', 16, 4096, 32, seed=1)
a = (wl['q'], wl['w'], wl['k_payload'], wl['k_scale'], 256, wl['ks'], wl['ke'])
d = dosa_cupy.dense_topk(*a)
seeds = cp.random.RandomState(3).randint(-1, 4096, (16, 300)).astype(cp.int32)
for kw in ({}, {'seeds': seeds}):
    i = dosa_cupy.dosa_topk(*a, buffer=16, **kw); f = dosa_cupy.fused_topk(*a, **kw)
    print('sanitizer-case', list(kw), 'ids equal', bool(cp.array_equal(d, i) and cp.array_equal(d, f)), i.dtype)
" 2>&1 | tee -a $L | tail -4
fi
echo "[$(date -u +%T)] sweep filter=$FILTER" | tee -a $L
# VARIANTS: extra `--variant NAME:k=v,...` arguments, e.g. "--variant pair:screen=pair,r=6"
python3 -m dosa_cupy.bench --sweep ${FILTER:+--filter $FILTER} --max-seconds ${MAXS:-330} $VARIANTS \
  --commit "$C" --out $OUT/sweep 2>&1 | tee -a $L | grep -vE "^\{" | tail -40
echo "[$(date -u +%T)] done" | tee -a $L
