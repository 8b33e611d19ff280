# Session 7, call 4: the final code: full GPU suite, route tests (memo), regimes with memo, small Qn, route-stage profile.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
V="--variant memo:route_memo=1 --variant dosa:route=dosa --no-peers"
st 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_route.py
st 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ --deselect tests/test_gpu_route.py
st 25 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072,32x64x131072 --variant nocheck:check=False --variant memo:route_memo=1 --no-peers --out $OUT/small
st 90 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 $V --max-seconds 80 --out $OUT/r128k
st 40 python3 .dev/route_prof.py
st 130 python3 -m dosa_cupy.bench --regime isotropic,many_positive,h64,trained --shapes 32x4096x1048576,64x4096x1048576 $V --max-seconds 95 --out $OUT/r1m
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|rc=|total_ms" $L | tail -14
