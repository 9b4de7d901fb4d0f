#!/usr/bin/env bash
# Before and after in one sitting on a lent GPU: `gpu_speed.py`'s CUDA rows with an earlier
# commit's fedrec and with this tree's, one after the other for each workload, after the `gpu`
# tests of this tree.
#
#   git archive HEAD~1 fedrec benchmarks | (mkdir -p before && tar -x -C before)
#   BEFORE=before OUT=/tmp/ba FEDREC_CACHE=$PWD/.devdata bash benchmarks/gpu_before_after.sh
#
# ML-100K must be in FEDREC_CACHE (the machine may have no network). Knobs: WORKLOADS
# (space-separated gpu_speed.py rows), BIG (rows whose split is drawn first on spare cores,
# default pfedrec-1m-users; empty: none), BIG_SIDES (the sides a big row runs, default
# "before after"), PREPARE (other rows whose split is drawn first on spare cores), AFTER (rows
# of this tree alone, after the pairs), BUDGET (seconds a row, default 20), BIG_BUDGET (90),
# TESTS (the gpu tests' files, default the device tests), TEST_TIMEOUT (150), WHEELS (a folder
# of wheels installed first, e.g. Optuna's for the tuning test), PROFILE (workloads profiled by
# function after the rows, `gpu_profile.py --cprofile`), PROFILE_TORCH (under PyTorch's profiler:
# the kernels' busy share and launch counts; both in $OUT/profiles.txt). Rows land in
# $OUT/before.jsonl and $OUT/after.jsonl, so a call stopped at its limit keeps what it measured.
set -u
OUT=${OUT:-/tmp/gpu-before-after}
BEFORE=${BEFORE:?BEFORE: a folder holding an earlier commit\'s fedrec/ and benchmarks/}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
HERE=$PWD
SPLITS=${SPLITS:-/tmp/fedrec-splits}
mkdir -p "$SPLITS"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$OUT/gpu.txt"
if [ -n "${WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
big=${BIG-pfedrec-1m-users}
prep=${PREPARE:-}
for w in $big $prep; do  # spare cores draw the big splits while the small rows run
    (PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH} $PY benchmarks/gpu_speed.py --prepare --workload "$w" --split-cache "$SPLITS" \
        > "$OUT/prepare-$w.log" 2>&1; touch "$SPLITS/.prepared-$w") &
done

workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH} timeout "${TEST_TIMEOUT:-150}" $PY -m pytest -m gpu -p no:cacheprovider $workers -q --tb=short -rf \
    ${TESTS:-tests/test_device_cohort.py tests/test_device.py} > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"
tail -n 15 "$OUT/gpu-tests.log"

row() {  # side, workload, budget
    local dir=$HERE
    case " $prep " in *" $2 "*) while [ ! -e "$SPLITS/.prepared-$2" ]; do sleep 2; done ;; esac
    [ "$1" = before ] && dir=$HERE/$BEFORE
    (cd "$dir" && PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} $PY benchmarks/gpu_speed.py --devices cuda --budget-s "$3" \
        --split-cache "$SPLITS" --json "$OUT/$1.jsonl" --workload "$2" 2>&1 | tail -n 1 | sed "s/^/$1  /")
}
for w in ${WORKLOADS:-pfedrec-ml100k pfedrec-ml1m gpfedrec-ml100k gfedpp-ml100k gpfedrec-ml1m}; do
    row before "$w" "${BUDGET:-20}"; row after "$w" "${BUDGET:-20}"
done | tee "$OUT/rows.txt"
for w in ${AFTER:-}; do
    row after "$w" "${BUDGET:-20}"
done | tee -a "$OUT/rows.txt"
for w in $big; do
    while [ ! -e "$SPLITS/.prepared-$w" ]; do sleep 2; done
    for side in ${BIG_SIDES:-before after}; do row "$side" "$w" "${BIG_BUDGET:-90}"; done | tee -a "$OUT/rows.txt"
done
wait
profile() {  # workload, gpu_profile.py's options: appended to one file (a call returns few files)
    local w=$1; shift
    PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH} $PY benchmarks/gpu_profile.py "$w" "$@" \
        --split-cache "$SPLITS" 2>&1 | grep -v -e UserWarning -e _warn_once >> "$OUT/profiles.txt"
}
for w in ${PROFILE:-}; do profile "$w" --cprofile --rounds 2 --top 30; done
for w in ${PROFILE_TORCH:-}; do profile "$w" --rounds 3 --top 25; done
grep "^== " "$OUT/profiles.txt" 2>/dev/null
