# Session 8, call 1: the previous session's unrun state (full GPU suite incl. torch ops and route tests), memcheck, fixed-cost profile.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ -rs
st 90 python3 .dev/seed_prof.py
st 80 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench --case sanitizer
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x -p no:cacheprovider tests/test_torch_ops.py
grep -E "passed|failed|^FAILED|ERROR SUMMARY|rc=" $L | tail -14
