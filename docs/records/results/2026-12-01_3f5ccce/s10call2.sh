# Session 10, call 2: the dense head start (route choice) — route/capture/serving tests (the decode captures on every regime new), then the regime table at 128K.
export DOSA_COMMIT=$(cat .dev/commit)
export PYTHONUNBUFFERED=1 DOSA_CACHE=/tmp/dosa-cubin PYTHONPATH=$PWD
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; echo "[$(date -u +%T)] rc=$?" >> $L; }
st 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_route.py tests/test_capture.py -k "head_start or decode_step or every_branch or memo or sampled_survival or captured_route" -rs
st 120 python3 -m dosa_cupy.bench --regime calibrated,h64,many_positive,isotropic,structured,gaussian,ties,equal,trained --shapes 32x4096x131072,64x4096x131072 --variant memo:route_memo=1 --variant dosa:route=dosa --no-peers --out $OUT/r128k
st 100 python3 -m pytest -q -p no:cacheprovider tests/test_serving.py tests/test_torch_ops.py tests/test_gpu_route.py -rs
rm -f $OUT/*/*.png
grep -E "passed|failed|^FAILED|Error|rc=" $L | tail -12
