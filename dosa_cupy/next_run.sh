#!/usr/bin/env bash
# The first device call of the next session (written 2026-11-30, third session): the whole
# GPU suite at the final commit, then the paired screen (`screen="pair", r=6`, opt-in) as a
# same-run variant on the shapes that decide whether it becomes the default — the 128K /
# 256K corners of the sweep and the h64 regime, where the CPU emulation predicts r = 6
# triples survival.  The full sweep with the variant: `VARIANTS="--variant
# pair:screen=pair,r=6" FILTER=... bash dosa_cupy/sweep_run.sh` in parts of ~5 minutes.
# Run it from a `git archive` of the commit with the id in ./COMMIT (the device copy's .git
# is the session-start commit; never `git checkout` there):
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
run 200 python3 -m pytest -q -s -m gpu tests/test_gpu.py tests/test_gpu_decode.py \
  tests/test_plan_fused.py tests/test_gpu_cert.py tests/test_refine_shared.py tests/test_screen_pair.py
run 180 python3 -m dosa_cupy.bench --regime calibrated \
  --shapes 32x4096x131072,64x4096x131072,32x32768x131072,32x4096x262144 \
  --variant pair:screen=pair,r=6 --variant auto:screen=auto --commit "$C" --out $OUT/pair_small
run 150 python3 -m dosa_cupy.bench --regime h64 --shapes 64x4096x1048576,64x4096x131072 \
  --variant pair:screen=pair,r=6 --variant auto:screen=auto --variant r30:r=30 --commit "$C" --out $OUT/pair_h64
grep -E "passed|failed|ERROR SUMMARY|error" $L | tail -20
