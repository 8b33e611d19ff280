# Session 10, call 5: fewer synchronizations in the route choice (device tables, one pair_plan read-back, the sample's build flag) — route / pair / tie tests, the regime table at 128K, the route-stage profile.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_route.py tests/test_gpu_tie_reject.py -rs
st 50 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "pair or plateau or dosa_equals_dense" -rs
st 100 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/r128k
st 30 python3 .dev/route_prof2.py
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|rc=" $L | tail -12
