#!/usr/bin/env bash
# One device call that runs what has not yet run on the H200 (session 2026-11-30 b):
# the dosa_ref.workloads regimes in tests/test_gpu.py, tests/test_gpu_decode.py, a
# compute-sanitizer pass over decode, the calibrated prefill bench, one ncu read of the
# screen kernel, and the decode bench at 1M.  Stages in priority order, each with its own
# timeout; everything lands in $OUT/all.tgz (+ $OUT/log).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; W=/tmp/vr; mkdir -p "$OUT" $W
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/log"; }
log "commit $(git log -1 --format=%H 2>/dev/null)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee -a "$OUT/log"
T0=$(date +%s); DEADLINE=${DEADLINE:-580}
stage() { # name timeout cmd...  (timeout clipped to what is left of DEADLINE seconds)
  local n=$1 t=$2; shift 2; local left=$((DEADLINE - $(date +%s) + T0))
  [ $left -lt $t ] && t=$left; [ $t -lt 5 ] && { log "skip $n (no time)"; return; }
  log "start $n (timeout $t s)"
  timeout "$t" "$@" > $W/$n.log 2>&1; local rc=$?
  log "end $n rc=$rc: $(tail -3 $W/$n.log | tr '\n' ' ' | cut -c1-400)"
}
S=${STAGES:-"prefill_tests decode_tests bench ncu sanit_decode bench_decode"}
for s in $S; do case $s in
  prefill_tests) stage $s ${T_PT:-170} python3 -m pytest -q -s tests/test_gpu.py -k "${PT_K:-calibrated or h64 or many_positive}" ;;
  decode_tests) stage $s ${T_DT:-150} python3 -m pytest -q -s tests/test_gpu_decode.py ;;
  bench) stage $s ${T_B:-200} python3 -m dosa_cupy.bench --regime calibrated --shapes "${B_SHAPES:-32x4096x1048576,64x4096x1048576}" --out $W/bench ;;
  ncu) stage $s ${T_N:-90} ncu --clock-control none -k regex:screen --launch-count 1 --set full -o $W/screen python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
wl = make_gpu_workload('calibrated', 1024, 262144, 32, seed=1)
dosa_cupy.dosa_topk(wl['q'], wl['w'], wl['k_payload'], wl['k_scale'], 2048, wl['ks'], wl['ke'], r=14)
cp.cuda.Device().synchronize()"
     ncu -i $W/screen.ncu-rep --page details > $W/ncu_details.txt 2>&1
     ncu -i $W/screen.ncu-rep --page source --csv --print-source sass > $W/ncu_sass.csv 2>&1 ;;
  sanit_decode) stage $s ${T_S:-100} compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x tests/test_gpu_decode.py -k "overflow or walk" ;;
  bench_decode) stage $s ${T_BD:-150} python3 -m dosa_cupy.bench_decode --filter x1048576 --out $W/decode ;;
  *) [ -n "$s" ] && stage $s ${T_X:-120} bash -c "$s" ;;
esac; done
rm -f $W/screen.ncu-rep.tmp; tar czf $OUT/all.tgz -C $W . ; log done
