#!/usr/bin/env bash
# One device call for a kernel version: GPU tests, compute-sanitizer on a small case, the
# calibrated bench at 1M for each DOSA_SCREEN_UNROLL variant, one ncu read of the screen.
# Usage (H200): [PT_K="..."] [UNROLLS="1 2"] bash dosa_cupy/perf_run.sh
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; W=/tmp/pr; mkdir -p "$OUT" $W
T0=$(date +%s); DEADLINE=${DEADLINE:-560}
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/log"; }
stage() { local n=$1 t=$2; shift 2; local left=$((DEADLINE - $(date +%s) + T0))
  [ $left -lt $t ] && t=$left; [ $t -lt 5 ] && { log "skip $n"; return; }
  log "start $n ($t s)"; timeout "$t" "$@" > $W/$n.log 2>&1; local rc=$?
  log "end $n rc=$rc: $(grep -E 'passed|failed|ERROR SUMMARY|error' $W/$n.log | tail -3 | tr '\n' ' ' | cut -c1-300)"; }
log "commit $(cat COMMIT 2>/dev/null || git log -1 --format=%H 2>/dev/null)"
stage tests ${T_T:-200} python3 -m pytest -q -s tests/test_gpu.py -k "${PT_K:-not nothing}"
stage sanit ${T_S:-90} compute-sanitizer --tool memcheck --print-limit 20 python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
for H, reg in ((32, 'calibrated'), (64, 'structured')):
    wl = make_gpu_workload(reg, 16, 4096, H, seed=1)
    a = (wl['q'], wl['w'], wl['k_payload'], wl['k_scale'], 256, wl['ks'], wl['ke'])
    d = dosa_cupy.dense_topk(*a); i = dosa_cupy.dosa_topk(*a, buffer=16)
    print('sanitizer-case', H, reg, 'ids equal', bool(cp.array_equal(d, i)))
"
for U in ${UNROLLS:-1 2}; do
  DOSA_SCREEN_UNROLL=$U stage bench_u$U ${T_B:-120} python3 -m dosa_cupy.bench --regime calibrated --shapes "${B_SHAPES:-32x4096x1048576,64x4096x1048576}" --out $W/bench_u$U
done
stage ncu ${T_N:-60} ncu --clock-control none -k regex:screen --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
wl = make_gpu_workload('calibrated', 1024, 262144, 32, seed=1)
dosa_cupy.dosa_topk(wl['q'], wl['w'], wl['k_payload'], wl['k_scale'], 2048, wl['ks'], wl['ke'], r=14)
cp.cuda.Device().synchronize()"
for f in $W/bench_u*/bench.md; do echo "== $f"; cat $f; done | tee -a $OUT/log
tar czf $OUT/all.tgz -C $W . ; log done
