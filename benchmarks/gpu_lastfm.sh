#!/usr/bin/env bash
# One call on a lent GPU machine: the Lastfm-2K runs too slow for a 2-core CPU, side by side.
#
#   OUT=$OUT DATA=.devdata/lastfm-2k-hetrec bash benchmarks/gpu_lastfm.sh
#
# 1. the leak-free board's rows at their defaults (benchmarks/leaderboard-lastfm2k-gpu.toml);
# 2. GFed-PP Table 2's GPFedRec row on the official split with the official code's negatives,
#    seeds 0-4, then its variant with the official code's graph rule (`fedrec reproduce`).
# DATA is a folder holding HetRec's user_taggedartists.dat (the machine has no network and no
# ../shared): an ignored folder of the repo that the call carries (`carry`), each call, since a
# call that does not carry it finds it gone and the registry falls back to downloading. Both stop at BUDGET seconds (default 500), keeping the runs that ended; the
# results come back as $OUT/runs.tgz (checkpoints left out), the logs beside it. For a dry run
# on a CPU: GRID (another bench file), DEVICE=cpu, SEEDS=0, ROUNDS=1.
set -u
OUT=${OUT:-/tmp/gpu-lastfm}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-500}
RUNS=${RUNS:-runs/gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FEDREC_DATA=${DATA:-.devdata/lastfm-2k-hetrec} FEDREC_CACHE=${FEDREC_CACHE:-/tmp/fedrec-cache}
mkdir -p "$RUNS"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
smi=$!

timeout -k 20 -s INT "$BUDGET" $PY -m fedrec bench "${GRID:-benchmarks/leaderboard-lastfm2k-gpu.toml}" \
    -o "$RUNS/bench" --workers "${BENCH_WORKERS:-10}" > "$OUT/bench.log" 2>&1 &
bench=$!
timeout -k 20 -s INT "$BUDGET" $PY -m fedrec reproduce gfedpp --tables 2 -d lastfm-2k \
    --negatives legacy-split --seeds "${SEEDS:-0,1,2,3,4}" --methods gpfedrec --device "${DEVICE:-cuda}" \
    ${ROUNDS:+--rounds $ROUNDS} --workers "${REPRO_WORKERS:-4}" --out-dir "$RUNS/reproduce" \
    > "$OUT/reproduce.log" 2>&1 &
repro=$!
# the CUDA test of `fedrec reproduce --device`, beside them
timeout 150 $PY -m pytest -m gpu -p no:cacheprovider -q --tb=short -rf tests/test_reproduce_runner.py \
    -k device > "$OUT/tests.log" 2>&1 &
tests=$!
wait $bench $repro $tests
kill $smi 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude='*.ckpt' -C "$RUNS" .
echo "--- bench"; tail -n 25 "$OUT/bench.log"
echo "--- reproduce"; tail -n 30 "$OUT/reproduce.log"
echo "--- tests"; tail -n 5 "$OUT/tests.log"
