#!/usr/bin/env bash
# Device-side inspection (no GPU time to speak of): SASS instruction mix of the hot kernels
# and one Nsight Compute speed-of-light read of a dense-logits launch.
OUT=${OUT:-/tmp/out}
nvcc -arch=sm_90 -std=c++17 -ftz=true -Idosa_cupy/csrc -cubin -o /tmp/k.cubin dosa_cupy/csrc/kernels.cu
for f in dense_logits_mt2 dense_logits_mt4 screen_mt1 refine_mt2; do
  cuobjdump -sass -fun $f /tmp/k.cubin > $OUT/sass_$f.txt 2>&1
  echo "== $f: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $OUT/sass_$f.txt) instructions"
  grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+' $OUT/sass_$f.txt | awk '{print $NF}' \
    | sort | uniq -c | sort -rn | head -14 | tr '\n' ' '; echo
done
timeout 120 ncu --clock-control none -k regex:dense_logits --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats python3 -c "
from dosa_cupy.workload import make_gpu_workload
import dosa_cupy, cupy as cp
wl = make_gpu_workload('gaussian', 1024, 131072, 32, seed=1, causal=False)
dosa_cupy.dense_logits(wl['q'], wl['w'], wl['k_payload'], wl['k_scale']); cp.cuda.Device().synchronize()
" 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -45 | tee $OUT/ncu.txt
