#!/usr/bin/env bash
# Profiles of the GPU workloads in one call on a lent machine: PyTorch's profiler (device busy
# time, launches, copies, top operators) and py-spy (the host's Python lines), then the `gpu`
# tests. Everything lands in $OUT/profiles.tgz; the summaries are printed too.
#
#   OUT=/tmp/prof FEDREC_CACHE=~/.cache/fedrec bash benchmarks/gpu_profile.sh
#
# py-spy must be on the PATH (a GPU image may lack it: carry its wheel). PROFILES: workloads
# given both profiles; SPY_ONLY: workloads with too many kernels for PyTorch's profiler.
set -u
OUT=${OUT:-/tmp/gpu-profile}
mkdir -p "$OUT"
work=$(mktemp -d)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
prof() { $PY benchmarks/gpu_profile.py --device "${DEVICE:-cuda}" "$@"; }

for w in ${PROFILES:-pfedrec-ml100k pfedrec-ml1m gpfedrec-ml100k personalfr-ml100k}; do
    prof "$w" --rounds 2 --top 12 > "$work/torch-$w.txt" 2>&1
    grep -A1 "^==" "$work/torch-$w.txt"
    tar -czf "$OUT/profiles.tgz" -C "$work" .
done
for w in ${PROFILES:-pfedrec-ml100k pfedrec-ml1m gpfedrec-ml100k personalfr-ml100k} ${SPY_ONLY:-fedrap-ml1m}; do
    py-spy record --idle -r 250 -f raw -o "$work/spy-$w.raw" -- \
        $PY benchmarks/gpu_profile.py "$w" --device "${DEVICE:-cuda}" --rounds 2 --no-torch-profiler > "$work/spy-$w.log" 2>&1
    { cat "$work/spy-$w.log"; prof --fold "$work/spy-$w.raw" --top 40; } > "$work/spy-$w.txt"
    grep "^==" "$work/spy-$w.log"
    tar -czf "$OUT/profiles.tgz" -C "$work" .  # after each: a call stopped at its limit keeps these
done
if [ -z "${NO_TESTS:-}" ]; then
    workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout "${TEST_TIMEOUT:-150}" $PY -m pytest -m gpu -p no:cacheprovider $workers -q --tb=short -rf \
        tests/test_device.py > "$work/gpu-tests.log" 2>&1
    echo "gpu tests: exit $?"; tail -n 15 "$work/gpu-tests.log"
fi
tar -czf "$OUT/profiles.tgz" -C "$work" .
