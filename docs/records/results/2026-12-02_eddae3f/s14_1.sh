#!/bin/bash
# session 14 call 1: the submitted state 6a0a198 (records after) on the H200
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DOSA_COMMIT=$(cat .dev/COMMIT)
export DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt; echo "commit $(cat .dev/COMMIT)" > $L
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; local rc=$?; echo "[$(date -u +%T)] rc=$rc" >> $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $L
mkdir -p /tmp/pk && tar -xJf .dev/peer.tar.xz -C /tmp/pk
( cd /tmp/pk && source .peer/build_deepgemm.sh > $OUT/dg.txt 2>&1; echo "dg build rc=$?" >> $OUT/dg.txt ) & DG=$!
V=qt4_w2_fresh,qt4_w2_half,qt4_w3_half,qt4_w2_pair,qt4_w4_chained
st 60 compute-sanitizer --tool memcheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x64x8192,32x64x8192 --variants $V --reps 2
st 60 compute-sanitizer --tool racecheck --print-limit 10 python3 -m dosa_cupy.bench.fp8_dense --shapes 32x16x4096 --variants qt4_w2_pair,qt4_w3_half --reps 2
st 100 bash -c "cd .stage_old && PYTHONPATH=\$PWD python3 ../dosa_cupy/bench/ids_dump.py /tmp/old.npz"
st 100 python3 dosa_cupy/bench/ids_dump.py /tmp/new.npz
st 20 python3 dosa_cupy/bench/ids_dump.py --compare /tmp/old.npz /tmp/new.npz
wait $DG; cat $OUT/dg.txt | tail -3 >> $L
source /tmp/pk/.peer/build_deepgemm.sh >> $L 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH
st 150 python3 -m dosa_cupy.bench.fp8_dense --shapes 64x4096x131072,32x4096x131072,64x4096x1048576,32x4096x1048576 --variants $V --reps 10
cp $L $OUT/log_head.txt
st 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ -x -q
grep -E "passed|failed|ERROR SUMMARY|RACECHECK|differ|equal|rc=" $L | tail -30
