# Session 7, call 2: select_kernel template fix + route choice: full GPU suite, memcheck, calibrated 1M with DeepGEMM, small Qn.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
export HOME=/tmp DG_JIT_CACHE_DIR=/tmp/dgjit LC_ALL=C CUDA_HOME=/usr/local/cuda
( source .peer/build_deepgemm.sh > /tmp/dgbuild.log 2>&1; echo "export PYTHONPATH=$PYTHONPATH" > /tmp/dgenv ) &
DGPID=$!
st 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_route.py
st 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ --deselect tests/test_gpu_route.py
st 40 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 40 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_route.py -k "early or (every_branch and calibrated and 32)"
wait $DGPID; tail -1 /tmp/dgbuild.log >> $L; source /tmp/dgenv; export PYTHONPATH=$PWD:$PYTHONPATH
st 100 python3 -m dosa_cupy.bench --regime calibrated --shapes 32x4096x1048576,64x4096x1048576 --variant dosa:route=dosa --out $OUT/pre
st 40 python3 -m dosa_cupy.bench --regime calibrated --shapes 64x1x131072,64x16x131072,64x64x131072,32x64x131072 --variant dosa:route=dosa --no-peers --out $OUT/small
rm -f $OUT/*/*.png $OUT/*/*.md.bak
grep -E "passed|failed|^FAILED|ERROR SUMMARY|rc=|deep_gemm" $L | tail -20
grep -E "^\| calibrated \| 256" $OUT/pre/bench.md | cut -c1-200
sed -n '/Route choice/,/^$/p' $OUT/pre/bench.md $OUT/small/bench.md
