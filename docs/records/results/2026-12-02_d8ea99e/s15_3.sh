#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DOSA_COMMIT=$(cat .dev/COMMIT) DOSA_ENCODER=$PWD/.real/encoder.safetensors DOSA_CORPUS=$PWD/.real/corpus.npz
L=$OUT/log.txt; echo "commit $(cat .dev/COMMIT)" > $L
st() { local t=$1; shift; echo "[$(date -u +%T)] $*" >> $L; timeout "$t" "$@" >> $L 2>&1; local rc=$?; echo "[$(date -u +%T)] rc=$rc" >> $L; }
mkdir -p /tmp/pk && tar -xJf .dev/peer.tar.xz -C /tmp/pk
( source /tmp/pk/.peer/build_deepgemm.sh > $OUT/dg.txt 2>&1; echo "dg build rc=$?" >> $OUT/dg.txt ) & DG=$!
for v in "64 n128q4_w3_seq" "32 qt8_w3_fresh"; do set -- $v
st 60 ncu --section WarpStateStats --section SourceCounters --launch-count 1 -k regex:dense_fp8_h$1_$2 -o $OUT/ncu_$2 python3 -m dosa_cupy.bench.fp8_dense --shapes $1x4096x131072 --variants $2 --reps 1
timeout 30 ncu --import $OUT/ncu_$2.ncu-rep --page source --print-source sass --csv > $OUT/sass_$2.csv 2>> $L
timeout 20 ncu --import $OUT/ncu_$2.ncu-rep --page details --print-details all > $OUT/details_$2.txt 2>> $L
done
wait $DG; tail -2 $OUT/dg.txt >> $L
source /tmp/pk/.peer/build_deepgemm.sh >> $L 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH
st 40 python3 .dev/dg_dump.py
st 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ -rs --deselect tests/test_gpu_fp8_probe.py::test_deepgemm_logits_against_its_model
grep -E "passed|failed|ERROR SUMMARY|RACECHECK|rc=" $L | tail -30
