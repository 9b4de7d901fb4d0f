#!/usr/bin/env bash
# The server's rule for item rows (--aggregation): the papers' FedAvg over the round's clients at
# each algorithm's defaults, against each row averaged over the clients that sent it at item rates
# RATES (AGG=samples: the rule that also steps by summed slot gradients). One seed, leak-free loo-sampled, 100 rounds; figures are read on validation (the sweep
# picks nothing on test). Usage: bash benchmarks/aggregation_sweep.sh OUT_DIR [DATASET...]
# (data from FEDREC_DATA or the cache; ../shared/data/<name> where present). A file of one's own:
# EXTRA="--columns user,item,,ts" bash benchmarks/aggregation_sweep.sh OUT path/to/file.csv
set -euo pipefail
out=${1:?output folder}; shift
datasets=${*:-ml-100k lastfm-2k}
rates=${RATES:-"10 30 100 300"}
algorithms=${ALGORITHMS:-"fedmf pfedrec"}
extra=${EXTRA:-}
rule=${AGG:-contributors}  # the rule the rates are for: contributors or samples
seed=${SEED:-0}; tag=""; [ "$seed" = 0 ] || tag="-s$seed"  # SEED=N: another seed, files marked -sN
mkdir -p "$out"
for d in $datasets; do
  name=$(basename "$d"); name=${name%.*}
  dir=""; for c in ../shared/data/$d ../shared/data/$d-hetrec; do [ -d "$c" ] && dir="--data-dir $c" && break; done
  for a in $algorithms; do
    f="$out/$a-$name-clients$tag.json"
    [ -f "$f" ] || OMP_NUM_THREADS=1 fedrec run "$a" -d "$d" $dir $extra --seed "$seed" -q -o "$f" >/dev/null \
      || echo "$a $d clients: failed (see above)"
    for r in $rates; do
      f="$out/$a-$name-$rule-$r$tag.json"
      [ -f "$f" ] || OMP_NUM_THREADS=1 fedrec run "$a" -d "$d" $dir $extra --seed "$seed" --aggregation "$rule" --lr-item "$r" -q -o "$f" >/dev/null \
        || echo "$a $d $rule $r: failed (see above)"
    done
  done
done
python - "$out" <<'PY'
import json, pathlib, sys
rows = []
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(p.read_text())
    fed = r["config"]["federated"]
    rule = fed.get("aggregation", "clients")
    rate = fed.get("lr_item") or "default"
    v, t = r["valid_at_best"], r["test"]
    rows.append((r["dataset"], r["algorithm"], rule, str(rate), r["seed"], r.get("status", "completed"), r["best_round"],
                 v.get("ndcg@10", float("nan")), t.get("hr@10", float("nan")), t.get("ndcg@10", float("nan"))))
print("| data | algorithm | rule | item rate | seed | status | best round | valid NDCG@10 | test HR@10 | test NDCG@10 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(f"{x:.4f}" if isinstance(x, float) else str(x) for x in row) + " |")
PY
