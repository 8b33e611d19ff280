# Session 9, call 3: the capturable prefill step (capture.py) — its GPU tests, memcheck, the serving bench's graph part, then the full GPU suite.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 150 python3 -m pytest -q -p no:cacheprovider tests/test_capture.py -x -rs
st 120 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_capture.py -k "overflow or invalid or (replay and calibrated-512)"
st 150 python3 -m dosa_cupy.bench --serving --parts graph,small --out $OUT/serving
st 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -x -rs --deselect tests/test_capture.py
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|ERROR SUMMARY|rc=" $L | tail -20
