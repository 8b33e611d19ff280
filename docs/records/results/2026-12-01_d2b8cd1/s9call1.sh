# Session 9, call 1 (prepared at the end of session 8): the unrun state after f9ceabe — full GPU suite, memcheck, serving bench.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -rs
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 90 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k "anchor_pool or (seed_records and 32) or kth_only"
st 90 python3 -m dosa_cupy.bench --serving --out $OUT/serving
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|ERROR SUMMARY|rc=" $L | tail -14
