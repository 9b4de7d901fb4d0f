#!/usr/bin/env bash
# One call on a lent GPU machine: GFed-PP's and GPFedRec's equal-budget searches on Lastfm-2K
# (10 trials of 100 rounds, seed 0, --from-defaults, as every other tuned row), each followed by
# its five seeds' sampled-ranking cells (benchmarks/leaderboard-lastfm2k-tuned-gpu.toml), then
# the `gpu` tests with what time is left.
#
#   OUT=$OUT DATA=.devdata/lastfm-2k-hetrec bash benchmarks/gpu_tune_lastfm.sh
#
# METHODS lists "method:workers" (trials trained at once): the searches run side by side, so
# their workers share the machine's cores (16 on the lent kinds). DATA is a folder holding
# HetRec's user_taggedartists.dat, carried (the machine has no network and no ../shared);
# Optuna travels as wheels in .whl (not in the machine's image): the call's command installs
# them first (.library/device/README.md). Each search stops at TUNE_BUDGET seconds, keeping its
# journal (a later call with the same journal goes on from it); everything stops at BUDGET.
# What comes back: runs.tgz (the configs, any journal, the cells without checkpoints) and the
# logs. Another data set: DATASET, DATA, GRID (its [grid] is taken, with the method, data set
# and device set) and BENCH_OUT, and TUNE_ARGS for the protocol (e.g. DATASET=ciao
# TUNE_ARGS="-p given-rating" GRID=benchmarks/leaderboard-ciao.toml). A dry run on a CPU:
# DEVICE=cpu DATASET=synthetic:200x500 TRIALS=2 TUNE_ARGS="--rounds 1" CONFIGS=/tmp/c BENCH_OUT=/tmp/b.
# A search longer than a lease (MetaMF on Ciao: about an hour of an H100): CHECKPOINT_EVERY=N
# saves each trial every N rounds beside its journal, and JOURNALS names a carried folder of the
# repo (e.g. .devtune, ignored) that holds the journals and saves; runs.tgz brings them back, so
# the next lease, carrying that folder, goes on from the cut-off trials' saves.
set -u
OUT=${OUT:-/tmp/gpu-tune}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-500}
TUNE_BUDGET=${TUNE_BUDGET:-380}
DEVICE=${DEVICE:-cuda}
DATASET=${DATASET:-lastfm-2k}
TRIALS=${TRIALS:-10}
TUNE_ARGS=${TUNE_ARGS:-}
METHODS=${METHODS:-gfedpp:10 gpfedrec:6}
GRID=${GRID:-benchmarks/leaderboard-lastfm2k-tuned-gpu.toml}
CONFIGS=${CONFIGS:-configs/tuned}
BENCH_OUT=${BENCH_OUT:-results/bench/leaderboard-lastfm2k-tuned-gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FEDREC_DATA=${DATA:-.devdata/lastfm-2k-hetrec} FEDREC_CACHE=${FEDREC_CACHE:-/tmp/fedrec-cache}
case $DATASET in synthetic*) ;; *) [ -n "$(ls -A "$FEDREC_DATA" 2>/dev/null)" ] || { echo "no data in $FEDREC_DATA: carry it"; exit 2; } ;; esac
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }
work=$(mktemp -d)
JOURNALS=${JOURNALS:-$work/journals}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-0}
mkdir -p "$CONFIGS" "$JOURNALS"

if [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 > "$OUT/smi.csv" 2>&1 &
    smi=$!
fi
$PY -c "import sys, torch, optuna; print(sys.version.split()[0], 'torch', torch.__version__, 'optuna', optuna.__version__)" \
    | tee -a "$OUT/gpu.txt"

search() {  # METHOD WORKERS: the search, then its seeds' cells with what is left of BUDGET
    local m=$1 w=$2 cfg="$CONFIGS/$1@$DATASET.json" grid="$work/$1.toml"
    # shellcheck disable=SC2086  # TUNE_ARGS is a list of options
    timeout -k 20 -s INT "$TUNE_BUDGET" $PY -m fedrec tune "$m" -d "$DATASET" --trials "$TRIALS" --seed 0 \
        --from-defaults --device "$DEVICE" --workers "$w" -o "$cfg" --journal "$JOURNALS/$m.journal" \
        --checkpoint-every "$CHECKPOINT_EVERY" $TUNE_ARGS > "$OUT/tune-$m.log" 2>&1
    echo "tune $m: exit $? after $(($(date +%s) - start)) s" | tee -a "$OUT/tune-$m.log"
    [ -e "$cfg" ] || return
    # GRID's [grid] with this method, data set and device, its data from FEDREC_DATA (the
    # grid's data_dir names a folder of the machine it was written on)
    { sed -n '/^\[grid\]/,/^\[tuned\]/p' "$GRID" | sed -E '/^\[tuned\]|^(algorithms|datasets|device|data_dir) =/d'
      printf 'algorithms = ["%s"]\ndatasets = ["%s"]\ndevice = "%s"\n' "$m" "$DATASET" "$DEVICE"
      printf '[tuned]\n"%s@%s" = "%s"\n' "$m" "$DATASET" "$(realpath "$cfg")"; } > "$grid"
    timeout -k 20 -s INT "$(left)" $PY -m fedrec bench "$grid" -o "$BENCH_OUT" > "$OUT/bench-$m.log" 2>&1
    echo "bench $m: exit $? after $(($(date +%s) - start)) s" | tee -a "$OUT/bench-$m.log"
}

pids=()
for mw in $METHODS; do
    search "${mw%%:*}" "${mw##*:}" &
    pids+=($!)
done
wait "${pids[@]}"
if [ "$(left)" -gt 60 ]; then  # the CUDA tests, `fedrec tune --device cuda --workers` among them
    xdist=$($PY -c "import xdist" 2>/dev/null && echo "-n 4")
    timeout "$(left)" $PY -m pytest -m gpu $xdist -p no:cacheprovider -q --tb=short -rf tests/test_device.py \
        > "$OUT/tests.log" 2>&1
    echo "gpu tests: exit $?" | tee -a "$OUT/tests.log"
fi
[ -n "${smi:-}" ] && kill "$smi"
for mw in $METHODS; do cp "$CONFIGS/${mw%%:*}@$DATASET.json" "$work/" 2>/dev/null; done
mkdir -p "$BENCH_OUT"
# the cells' checkpoints stay (GBs for GFed-PP); the trials' saves come back with their journals
journals=()  # JOURNALS, when it is not inside $work (which goes whole)
case $(realpath "$JOURNALS") in "$work"/*) ;; *) journals=(-C "$(dirname "$(realpath "$JOURNALS")")" "$(basename "$JOURNALS")") ;; esac
tar czf "$OUT/runs.tgz" --exclude='*cells/*.ckpt' -C "$work" . "${journals[@]}" -C "$PWD" "$BENCH_OUT"
for f in "$OUT"/tune-*.log "$OUT"/bench-*.log; do echo "--- $f"; tail -n 6 "$f"; done
tail -n 4 "$OUT/tests.log" 2>/dev/null
