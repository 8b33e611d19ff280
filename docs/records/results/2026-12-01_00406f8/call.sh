# Session 7, call 1: the previous session's unrun state: full GPU suite, sanitizers, decode grid, prefill 1M, route-choice baselines.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
export HOME=/tmp DG_JIT_CACHE_DIR=/tmp/dgjit LC_ALL=C CUDA_HOME=/usr/local/cuda
( source .peer/build_deepgemm.sh > /tmp/dgbuild.log 2>&1; echo "export PYTHONPATH=$PYTHONPATH" > /tmp/dgenv ) &
DGPID=$!
st 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/
grep -E "passed|failed|^FAILED" $L | head -20
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_decode.py -k "cupy_graph or witness_dedup or long_context or nan"
wait $DGPID; tail -1 /tmp/dgbuild.log >> $L; source /tmp/dgenv; export PYTHONPATH=$PWD:$PYTHONPATH
st 90 python3 -m dosa_cupy.bench --decode --next-n 1,2 --shapes 32x1x131072,32x1x1048576,32x8x131072,32x8x1048576,32x64x131072,32x64x1048576,64x1x131072,64x1x1048576,64x8x131072,64x8x1048576,64x64x131072,64x64x1048576 --out $OUT/dec
st 100 python3 -m dosa_cupy.bench --regime calibrated --shapes 32x4096x1048576,64x4096x1048576 --out $OUT/pre
st 120 python3 -m dosa_cupy.bench --regime isotropic,many_positive --shapes 32x4096x1048576,64x4096x1048576 --variant r30:r=30 --variant pair:screen=pair --variant fp64:screen=fp64 --no-peers --out $OUT/iso
st 60 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072 --no-peers --out $OUT/small
rm -f $OUT/*/*.png
sed -n '/Captured in CUDA graphs/,$p' $OUT/dec/bench_decode.md | head -40
grep -E "^\| calibrated \| 256" $OUT/pre/bench.md
grep -E "passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|rc=|deep_gemm|peer .* failed" $L | tail -20
