#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DOSA_COMMIT=$(cat .dev/COMMIT) DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt; echo "commit $(cat .dev/COMMIT)" > $L
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; local rc=$?; echo "[$(date -u +%T)] rc=$rc" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $L
mkdir -p /tmp/pk && tar -xJf .dev/peer.tar.xz -C /tmp/pk
( source /tmp/pk/.peer/build_deepgemm.sh > $OUT/dg.txt 2>&1; echo "dg build rc=$?" >> $OUT/dg.txt ) & DG=$!
st 80 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x64x8192,32x64x8192 --reps 1
st 50 compute-sanitizer --tool racecheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x8x4096,32x16x4096 --variants n128q4_w3_seq,qt8_w4_seq --reps 1
wait $DG; tail -2 $OUT/dg.txt >> $L
source /tmp/pk/.peer/build_deepgemm.sh >> $L 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH
st 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fp8_probe.py -rs
st 90 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x131072,32x4096x131072 --reps 10
st 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ -x -rs
st 120 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x1048576,32x4096x1048576 --variants n128q4_w2_fresh,n128q4_w3_seq,qt8_w3_fresh,qt8_w4_seq --reps 5
grep -E "passed|failed|ERROR SUMMARY|RACECHECK|rc=" $L | tail -30
