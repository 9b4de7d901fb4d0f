"""Write a sparse synthetic data set as a CSV of one's own (user, item, ts), for measurements on
data as sparse as the held-out sets of the transfer work (about 8,000 users, 12,000 items and
7 interactions a user):

    python benchmarks/sparse_synthetic.py /tmp/sparse.csv --users 8000 --items 12000 --mean 7
    EXTRA="--columns user,item,,ts" bash benchmarks/aggregation_sweep.sh OUT /tmp/sparse.csv
"""

from __future__ import annotations

import argparse

import numpy as np

from fedrec.data.synthetic import synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--users", type=int, default=8000)
    ap.add_argument("--items", type=int, default=12000)
    ap.add_argument("--mean", type=float, default=7.0, help="mean interactions a user")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    x = synthetic(args.users, args.items, mean_interactions=args.mean, min_interactions=3, seed=args.seed)
    rows = np.column_stack([x.user_ids[x.users], x.item_ids[x.items], x.timestamps])
    np.savetxt(args.out, rows, fmt="%d", delimiter=",", header="user,item,ts", comments="")
    print(f"wrote {args.out}: {len(x):,} interactions, {x.n_users:,} users, {x.n_items:,} items")


if __name__ == "__main__":
    main()
