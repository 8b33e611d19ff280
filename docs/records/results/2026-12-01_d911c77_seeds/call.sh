# Session 8, call 2: the new fixed-cost kernels (check_values, anchor pool, tiled seeds): their tests, exactness suites, profile, small-Qn and stage split.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k "check_values or anchor_pool or seed_records or value_checks"
st 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_route.py tests/test_gpu_cert.py tests/test_gpu_tie_reject.py $(ls tests/test_serving.py 2>/dev/null)
st 60 python3 .dev/seed_prof.py
st 40 python3 .dev/route_prof.py
st 30 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072,32x64x131072 --variant nocheck:check=False --no-peers --out $OUT/small
st 80 python3 -m dosa_cupy.bench --regime calibrated --shapes 32x4096x131072,64x4096x131072,32x4096x1048576,64x4096x1048576 --variant dosa:route=dosa --no-peers --max-seconds 70 --out $OUT/cal
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|rc=" $L | tail -14
