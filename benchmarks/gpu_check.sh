#!/usr/bin/env bash
# One call on a lent GPU machine: the `gpu` tests, then benchmarks/gpu_speed.py's CUDA column,
# with its CPU column and the 10^6-user split drawn beside them on spare cores.
#
#   OUT=/tmp/gpu FEDREC_CACHE=~/.cache/fedrec bash benchmarks/gpu_check.sh
#
# ML-100K must be in FEDREC_CACHE (the machine may have no network). Every log and JSON row
# lands in $OUT, so a call stopped at its limit still returns what it measured. Knobs:
# BUDGET (seconds a CUDA row, default 30), BIG_BUDGET (the 10^6-user row, 150), CPU_BUDGET (40),
# TEST_TIMEOUT (150), WORKLOADS (space-separated CUDA rows, default all), SIDE=0 (no CPU column).
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SPLITS=${SPLITS:-/tmp/fedrec-splits}
mkdir -p "$SPLITS"; rm -f "$SPLITS/.prepared"
bench() { $PY benchmarks/gpu_speed.py --split-cache "$SPLITS" "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$OUT/gpu.txt"

# spare cores: the synthetic splits, then the CPU column (one thread a row)
touch "$OUT/bench-cpu.txt" "$OUT/prepare.log"
if [ "${SIDE:-1}" != 0 ]; then
    (bench --prepare --workload pfedrec-1m-users --workload pfedrec-ml1m > "$OUT/prepare.log" 2>&1
     touch "$SPLITS/.prepared"  # done, drawn or not: the 10^6-user row draws its own if not
     bench --devices cpu --budget-s "${CPU_BUDGET:-40}" --json "$OUT/bench-cpu.jsonl" > "$OUT/bench-cpu.txt" 2>&1) &
fi

workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")  # pytest-xdist where installed
timeout "${TEST_TIMEOUT:-150}" $PY -m pytest -m gpu -p no:cacheprovider $workers -q --tb=short -rf \
    tests/test_device.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"
tail -n 25 "$OUT/gpu-tests.log"

rows=${WORKLOADS:-pfedrec-ml100k pfedrec-ml1m fedrap-ml1m gpfedrec-ml100k gfedpp-ml100k gpfedrec-ml1m fedcia-mf-per-user personalfr-ml100k}
for w in $rows; do
    bench --devices cuda --budget-s "${BUDGET:-30}" --json "$OUT/bench-cuda.jsonl" --workload "$w" 2>&1 \
        | tail -n 1 | tee -a "$OUT/bench-cuda.txt"
done
if [ -z "${WORKLOADS:-}" ]; then
    while [ ! -e "$SPLITS/.prepared" ] && [ -n "$(jobs -r)" ]; do sleep 2; done
    bench --devices cuda --budget-s "${BIG_BUDGET:-150}" --json "$OUT/bench-cuda.jsonl" \
        --workload pfedrec-1m-users 2>&1 | tail -n 1 | tee -a "$OUT/bench-cuda.txt"
fi
wait
echo "--- CPU column"
cat "$OUT/bench-cpu.txt" "$OUT/prepare.log"
