#!/usr/bin/env bash
# The first device call of the next session: everything written without a GPU on
# 2026-11-30 (second session) — certificate seeds (cert_seeds=), the fused planner
# (planner="fused"), the shared refinement stream (stream="shared"), the fp32 pre-test of
# the screen (screen="fast32") — plus the regression
# suite, compute-sanitizer on small cases, and the 1M / 128K benchmark with each opt-in as
# a same-run variant.  Run it from a `git archive` of the commit with the id in ./COMMIT
# (the device copy's .git is the session-start commit; never `git checkout` there):
#   here:   rm -rf .stage && mkdir .stage && git archive HEAD | tar -x -C .stage &&
#           git rev-parse HEAD > .stage/COMMIT
#   device: run(command="cd .stage && bash dosa_cupy/next_run.sh", carry=[".stage"])
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=$OUT/logs.txt
C=$(cat COMMIT 2>/dev/null || echo unknown)
T0=$(date +%s); DEADLINE=${DEADLINE:-560}
left() { echo $((DEADLINE - $(date +%s) + T0)); }
run() { local t=$1; shift; local l; l=$(left); [ "$l" -lt "$t" ] && t=$l
  [ "$t" -lt 5 ] && { echo "[skip] $*" | tee -a $L; return; }
  echo "[$(date -u +%T)] ($t s) $*" | tee -a $L
  timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$? $(tail -1 $L | cut -c1-200)" | tee -a $L; }
echo "commit $C" | tee -a $L
run 200 python3 -m pytest -q -s tests/test_gpu_cert.py tests/test_plan_fused.py tests/test_refine_shared.py -m gpu
run 120 python3 -m pytest -q tests/test_gpu.py tests/test_gpu_decode.py
run 180 python3 -m dosa_cupy.bench --regime calibrated --shapes 32x4096x1048576,64x4096x1048576,32x4096x131072 \
  --variant cert:cert_seeds=2048 --variant fplan:planner=fused --variant shared:stream=shared \
  --variant fast32:screen=fast32 \
  --variant all:cert_seeds=2048,planner=fused,stream=shared,screen=fast32 \
  --commit "$C" --out $OUT/bench
run 60 python3 -m dosa_cupy.profile_plan --Qn 4096 --N 131072
run 60 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x tests/test_gpu_cert.py -k "structured and 32"
run 60 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x tests/test_refine_shared.py -k "records_exact and 64"
run 60 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -x tests/test_plan_fused.py -k "H32-r14-structured"
grep -E "passed|failed|ERROR SUMMARY|error" $L | tail -20
