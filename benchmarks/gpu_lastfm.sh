#!/usr/bin/env bash
# One call on a lent GPU machine: the Lastfm-2K runs too slow for a 2-core CPU, side by side.
#
#   OUT=$OUT DATA=.devdata/lastfm-2k-hetrec bash benchmarks/gpu_lastfm.sh
#
# 1. the leak-free board's cells at their defaults that results/ lacks
#    (benchmarks/leaderboard-lastfm2k-gpu.toml; once the sampled ones are in: the full-ranking ones);
# 2. a `fedrec reproduce` of GFed-PP's Table 2 on Lastfm-2K: REPRO (default: GFed-PP and
#    GPFedRec under the official code's negatives on fedrec's split, seed 0; GPFedRec's ten runs
#    in results/reproduce-h200/lastfm-2k/ came from this call, see results/gpu/h200-lastfm-2k/).
# DATA is a folder holding HetRec's user_taggedartists.dat (the machine has no network and no
# ../shared): an ignored folder of the repo that every call names in `carry` (a call that does
# not finds it gone, and the registry falls back to downloading). Both stop at BUDGET seconds
# (default 500), keeping the runs that ended; what ran comes back as $OUT/runs.tgz (checkpoints
# left out), the logs beside it. For a dry run on a CPU: GRID (another bench file), BENCH_OUT
# and REPRO_OUT (folders outside results/), DEVICE=cpu, REPRO="... --seeds 0 --rounds 1".
set -u
OUT=${OUT:-/tmp/gpu-lastfm}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-500}
RUNS=${RUNS:-runs/gpu}
BENCH_OUT=${BENCH_OUT:-results/bench/leaderboard-lastfm2k-gpu}  # its cells found there are not run again
REPRO_OUT=${REPRO_OUT:-results/reproduce-h200}  # likewise its result files (a GPU's, kept apart)
REPRO=${REPRO:---negatives legacy --seeds 0 --methods gfedpp,gpfedrec}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FEDREC_DATA=${DATA:-.devdata/lastfm-2k-hetrec} FEDREC_CACHE=${FEDREC_CACHE:-/tmp/fedrec-cache}
[ -e "$FEDREC_DATA/user_taggedartists.dat" ] || { echo "no $FEDREC_DATA/user_taggedartists.dat: carry it"; exit 2; }
mkdir -p "$RUNS"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
smi=$!

timeout -k 20 -s INT "$BUDGET" $PY -m fedrec bench "${GRID:-benchmarks/leaderboard-lastfm2k-gpu.toml}" \
    -o "$BENCH_OUT" --workers "${BENCH_WORKERS:-10}" > "$OUT/bench.log" 2>&1 &
bench=$!
# shellcheck disable=SC2086  # REPRO is a list of options
timeout -k 20 -s INT "$BUDGET" $PY -m fedrec reproduce gfedpp --tables 2 -d lastfm-2k $REPRO \
    --device "${DEVICE:-cuda}" --workers "${REPRO_WORKERS:-4}" --out-dir "$REPRO_OUT" \
    > "$OUT/reproduce.log" 2>&1 &
repro=$!
# the CUDA tests of `fedrec reproduce --device` and of full-ranking scores, beside them
xdist=$($PY -c "import xdist" 2>/dev/null && echo "-n 4")  # pytest-xdist where installed
timeout 240 $PY -m pytest -m gpu $xdist -p no:cacheprovider -q --tb=short -rf tests/test_reproduce_runner.py \
    tests/test_device.py > "$OUT/tests.log" 2>&1 &
tests=$!
wait $bench $repro $tests
kill $smi 2>/dev/null
mkdir -p "$RUNS/bench" "$RUNS/reproduce" && cp -r "$BENCH_OUT"/. "$RUNS/bench/" && cp -r "$REPRO_OUT"/. "$RUNS/reproduce/"
tar czf "$OUT/runs.tgz" --exclude='*.ckpt' -C "$RUNS" .
echo "--- bench"; tail -n 25 "$OUT/bench.log"
echo "--- reproduce"; tail -n 30 "$OUT/reproduce.log"
echo "--- tests"; tail -n 5 "$OUT/tests.log"
