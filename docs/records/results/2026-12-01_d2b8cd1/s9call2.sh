# Session 9, call 2: what session 8 could not fit — the trained regime at 1M, the 14 sweep shapes not run (Qn 16K at 768K / 1M, Qn 32K).
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 90 python3 -m dosa_cupy.bench --regime trained --shapes 32x4096x1048576,64x4096x1048576 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/trained1m
# the dry run estimates ~750 s for these 14 shapes: split over two calls (e.g. x16384x786432,x16384x1048576,x32768x131072,x32768x262144 then the other x32768 shapes)
st 330 python3 -m dosa_cupy.bench --sweep --filter x16384x786432,x16384x1048576,x32768x131072,x32768x262144 --no-peers --max-seconds 300 --out $OUT/sweep_rest
rm -f $OUT/*/*.png
grep -E "rc=|done in" $L | tail -20
