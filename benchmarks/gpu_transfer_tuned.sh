#!/usr/bin/env bash
# One call on a lent GPU machine: the transfer table's tuned column for GPFedRec and GFed-PP
# (`fedrec compare`, 8 trials on seed 0's validation split, then seeds 0-2 at the best setting)
# on ML-100K and Lastfm-2K, four comparisons side by side, and the full-ranking cells of
# benchmarks/transfer-defaults-full-gpu.toml still missing, for BUDGET seconds (default 540).
# A comparison stopped by the budget goes on where it stopped when the same command runs again.
#
#   OUT=$OUT DATA=.devdata WHEELS=.whl bash benchmarks/gpu_transfer_tuned.sh
#
# DATA holds ml-100k/ and lastfm-2k-hetrec/ as ../shared/data does; WHEELS, Optuna and its needs
# for the machine's Python (it has none): both ignored folders of the repository that the call
# names in `carry`. The folders come back as $OUT/tuned.tgz, to unpack in the repository's root.
set -u
OUT=${OUT:-/tmp/gpu-transfer-tuned}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
export FEDREC_DATA=${DATA:-.devdata} FEDREC_CACHE=${FEDREC_CACHE:-/tmp/fedrec-cache}
[ -e "$FEDREC_DATA/lastfm-2k-hetrec/user_taggedartists.dat" ] || { echo "no $FEDREC_DATA/lastfm-2k-hetrec: carry it"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy, optuna; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'optuna', optuna.__version__)" \
    | tee -a "$OUT/gpu.txt" || exit 2
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
smi=$!
budget=${BUDGET:-540}
start=$(date +%s)
pids=()
for dataset in ml-100k lastfm-2k; do
    for algorithm in gpfedrec gfedpp; do
        timeout -k 20 -s INT "$budget" $PY -m fedrec compare "$algorithm" -d "$dataset" -p loo-sampled \
            --seeds 3 --trials 8 --workers 3 --device cuda -o "results/transfer-tuned/$dataset-$algorithm" \
            > "$OUT/compare-$dataset-$algorithm.log" 2>&1 &
        pids+=($!)
    done
done
timeout -k 20 -s INT "$budget" $PY -m fedrec bench benchmarks/transfer-defaults-full-gpu.toml \
    -o results/bench/transfer-defaults-full-gpu > "$OUT/bench-full.log" 2>&1 &
pids+=($!)
wait "${pids[@]}"
echo "all done after $(( $(date +%s) - start )) s"
kill $smi 2>/dev/null
tar czf "$OUT/tuned.tgz" results/transfer-tuned/*-gpfedrec results/transfer-tuned/*-gfedpp \
    results/bench/transfer-defaults-full-gpu 2>/dev/null
tail -n 4 "$OUT"/compare-*.log "$OUT"/bench-full.log
