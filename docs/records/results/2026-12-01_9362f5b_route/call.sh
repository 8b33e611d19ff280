# Session 7, call 3: route choice across regimes (issue 14 Done-when), route/check tests, small Qn.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
V="--variant dosa:route=dosa --variant r30:route=dosa,r=30 --no-peers"
st 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_route.py tests/test_gpu.py -k "route or value_checks or bad_input or public_ids or branch or sampled or early"
st 30 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072,32x64x131072 --variant nocheck:check=False --no-peers --out $OUT/small
st 170 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 $V --max-seconds 140 --out $OUT/r128k
st 230 python3 -m dosa_cupy.bench --regime isotropic,many_positive,h64,trained,structured --shapes 32x4096x1048576,64x4096x1048576 $V --max-seconds 190 --out $OUT/r1m
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|rc=" $L | tail -12
for d in small r128k r1m; do sed -n '/Route choice/,/^$/p' $OUT/$d/bench.md; done
