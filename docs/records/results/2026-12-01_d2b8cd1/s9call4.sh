# Session 9, call 4: the route choice before the seeds (anchor_stage + sampled seeds) and the capture tests for every regime — GPU tests, memcheck, the regime table at 128K and 1M.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_route.py tests/test_capture.py -rs
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 90 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/r128k
st 120 python3 -m dosa_cupy.bench --regime isotropic,many_positive --shapes 32x4096x1048576,64x4096x1048576 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/r1m
st 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -rs --deselect tests/test_gpu_route.py --deselect tests/test_capture.py
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|ERROR SUMMARY|rc=" $L | tail -20
