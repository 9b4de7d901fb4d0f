#!/usr/bin/env bash
# One call on a lent GPU machine: the transfer table's GPFedRec and GFed-PP cells
# (benchmarks/transfer-{defaults,papers}-gpu.toml), fifteen side by side, for BUDGET seconds
# (default 420; a stopped grid goes on where it stopped when run again with its cells).
#
#   OUT=$OUT DATA=.devdata bash benchmarks/gpu_transfer.sh
#
# DATA holds ml-100k/ and lastfm-2k-hetrec/ as ../shared/data does (an ignored folder of the repo
# that the call names in `carry`: the machine has no ../shared and no network). The cells come
# back as $OUT/cells.tgz, to unpack in the repository's root; the logs beside it.
set -u
OUT=${OUT:-/tmp/gpu-transfer}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
export FEDREC_DATA=${DATA:-.devdata} FEDREC_CACHE=${FEDREC_CACHE:-/tmp/fedrec-cache}
[ -e "$FEDREC_DATA/lastfm-2k-hetrec/user_taggedartists.dat" ] || { echo "no $FEDREC_DATA/lastfm-2k-hetrec: carry it"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
smi=$!
start=$(date +%s)
for settings in defaults papers; do
    left=$(( ${BUDGET:-420} - ($(date +%s) - start) ))
    [ "$left" -gt 20 ] || break
    timeout -k 20 -s INT "$left" $PY -m fedrec bench "benchmarks/transfer-$settings-gpu.toml" \
        -o "results/bench/transfer-$settings-gpu" > "$OUT/bench-$settings.log" 2>&1
    echo "$settings: exit $? after $(( $(date +%s) - start )) s"
done
kill $smi 2>/dev/null
tar czf "$OUT/cells.tgz" results/bench/transfer-*-gpu 2>/dev/null
tail -n 5 "$OUT"/bench-*.log
