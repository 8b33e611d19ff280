# Session 10, call 1: the ninth session's unrun state (9e48d61) — full GPU suite (five capture tests never run), memcheck on the new capture tests, serving bench, the route-stage profile.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -rs --durations=15
st 100 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -p no:cacheprovider tests/test_capture.py -k "screening_is_kept or small_or_empty or unpadded or strided_scale"
st 90 python3 -m dosa_cupy.bench --serving --out $OUT/serving
st 50 python3 .dev/route_prof2.py > $OUT/route_prof2.txt
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|ERROR SUMMARY|rc=" $L | tail -14
