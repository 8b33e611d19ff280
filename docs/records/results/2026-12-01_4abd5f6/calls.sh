# Session 8, call 3: the session's code: full GPU suite, memcheck of the new kernels, small-Qn, serving bench, route-stage profile.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -rs
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 90 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k "check_values or anchor_pool or (seed_records and 32) or kth_only or value_checks"
st 30 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072,32x64x131072 --variant nocheck:check=False --no-peers --out $OUT/small
st 40 python3 .dev/route_prof.py
st 90 python3 -m dosa_cupy.bench --serving --out $OUT/serving
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|ERROR SUMMARY|rc=" $L | tail -14
# Session 8, call 4: regimes at 128K and 1M (route choice with memo and fixed DoSA), stage splits.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
V="--variant memo:route_memo=1 --variant dosa:route=dosa --no-peers"
st 100 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 $V --max-seconds 85 --out $OUT/r128k
st 150 python3 -m dosa_cupy.bench --regime calibrated,isotropic,many_positive,h64,trained --shapes 32x4096x1048576,64x4096x1048576 $V --max-seconds 130 --out $OUT/r1m
rm -f $OUT/*/*.png
grep -E "rc=" $L | tail -4
# Session 8, call 5: the sweep's Qn = 4096 and 8192 shapes (20 of 40; calibrated, no peers) with the route choice.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 440 python3 -m dosa_cupy.bench --sweep --filter x4096x,x8192x --no-peers --max-seconds 400 --out $OUT/sweep
rm -f $OUT/*/*.png
grep -E "rc=|done in" $L | tail -24

# Session 8, call 6 (one command):
# timeout 230 python3 -m dosa_cupy.bench --sweep --filter x16384x131072,x16384x262144,x16384x524288 --no-peers --max-seconds 190 --out $OUT/sweep16k
