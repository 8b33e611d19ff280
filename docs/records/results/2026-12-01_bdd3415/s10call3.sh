# Session 10, call 3: the small-chunk host profile, then the six sweep shapes never run (Qn = 32K x 512K / 768K / 1M, H 32 / 64).
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 60 python3 .dev/small_prof.py
st 500 python3 -m dosa_cupy.bench --sweep --filter x32768x524288,x32768x786432,x32768x1048576 --no-peers --out $OUT/sweep32k
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|rc=" $L | tail -12
