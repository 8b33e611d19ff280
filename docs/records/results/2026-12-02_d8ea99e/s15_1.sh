#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DOSA_COMMIT=$(cat .dev/COMMIT) DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt; echo "commit $(cat .dev/COMMIT)" > $L
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; local rc=$?; echo "[$(date -u +%T)] rc=$rc" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $L
mkdir -p /tmp/pk && tar -xJf .dev/peer.tar.xz -C /tmp/pk
( source /tmp/pk/.peer/build_deepgemm.sh > $OUT/dg.txt 2>&1; echo "dg build rc=$?" >> $OUT/dg.txt ) & DG=$!
st 70 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x64x8192,32x64x8192 --reps 2
st 60 compute-sanitizer --tool racecheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x8x4096,32x16x4096 --variants n128q4_w3_seq,qt8_w4_seq,n128q4_w2_fresh --reps 1
wait $DG; tail -2 $OUT/dg.txt >> $L
source /tmp/pk/.peer/build_deepgemm.sh >> $L 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH
st 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fp8_probe.py -rs
st 200 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x131072,32x4096x131072,64x4096x1048576,32x4096x1048576 --reps 10
for v in n128q4_w2_fresh qt8_w3_fresh n128q4_w3_seq qt8_w4_seq; do H=64; case $v in qt8*) H=32;; esac
st 60 ncu --section WarpStateStats --section SpeedOfLight -k regex:dense_fp8 --launch-count 1 python3 -m dosa_cupy.bench.fp8_dense --shapes ${H}x4096x131072 --variants $v --reps 1
done
grep -E "passed|failed|ERROR SUMMARY|RACECHECK|rc=" $L | tail -30
