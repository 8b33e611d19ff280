# Session 10, call 4: dosa bench --serving (part (a) interleaved), then the regimes never run at 1M (structured, gaussian, ties, equal; H 32 / 64) with the memo and route=dosa variants.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 90 python3 -m dosa_cupy.bench --serving --out $OUT/serving
st 440 python3 -m dosa_cupy.bench --regime structured,gaussian,ties,equal --shapes 32x4096x1048576,64x4096x1048576 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/r1m
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|rc=" $L | tail -12
