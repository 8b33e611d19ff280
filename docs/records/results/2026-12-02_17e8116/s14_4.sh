#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DOSA_COMMIT=$(cat .dev/COMMIT)
L=$OUT/log.txt; echo "commit $(cat .dev/COMMIT)" > $L
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; local rc=$?; echo "[$(date -u +%T)] rc=$rc" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $L
mkdir -p /tmp/pk && tar -xJf .dev/peer.tar.xz -C /tmp/pk
( source /tmp/pk/.peer/build_deepgemm.sh > $OUT/dg.txt 2>&1; echo "dg build rc=$?" >> $OUT/dg.txt ) & DG=$!
V=qt4_w3_tri,qt8_w3_tri,n128q2_w2_tri,n128q4_w2_tri
st 50 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x64x8192,32x64x8192 --variants qt8_w3_tri,n128q4_w2_tri --reps 2

st 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_fp8_probe.py
wait $DG; tail -2 $OUT/dg.txt >> $L
source /tmp/pk/.peer/build_deepgemm.sh >> $L 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH
st 150 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x1048576,32x4096x1048576 --variants $V --reps 5
grep -E "passed|failed|ERROR SUMMARY|RACECHECK|rc=" $L | tail -30
