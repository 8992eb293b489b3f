r"""`minite ledger`: the results ledger (minite.rl.results_ledger), where finished RL runs accumulate.

    minite ledger add results/claims/rl/*/seed* --into results/ledger
        file each run's record as results/ledger/<profile>/<arm>/seed<S>.json (the run's final lm-eval
        JSON results/<profile>/eval/<arm>/seed<S>.json goes in when it exists)
    minite ledger hash results/claims/runs/minite
        print the hash an arm's runs have now (its resolved train.yaml + recipe.yaml)
    minite ledger holds --into results/ledger --profile claims --arm minite --seed 3 \
        --spec results/claims/runs/minite
        exit 0 when the ledger holds (arm, seed) with the arm's current hash, 1 when not

Records whose hash is not the arm's current one are refused by `minite claims --ledger` (not pooled).
"""

from __future__ import annotations

import argparse
import sys

from minite.commands.common import run_guarded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite ledger", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="action", required=True)
    a = sub.add_parser("add", help="file the records of finished RL run folders")
    a.add_argument("run_dirs", nargs="+", help="RL run folders (results/<profile>/rl/<arm>/seed<S>)")
    a.add_argument("--into", required=True, help="the ledger's root (results/ledger)")
    a.add_argument("--profile", help="profile name (default: from the folder's place)")
    a.add_argument("--arm", help="arm name (default: from the folder's place)")
    h = sub.add_parser("hash", help="print an arm's current hash from its resolved run folder")
    h.add_argument("spec", help="results/<profile>/runs/<arm> (train.yaml + recipe.yaml)")
    q = sub.add_parser("holds", help="exit 0 when the ledger holds (arm, seed) at the arm's current hash")
    q.add_argument("--into", required=True)
    q.add_argument("--profile", required=True)
    q.add_argument("--arm", required=True)
    q.add_argument("--seed", type=int, required=True)
    q.add_argument("--spec", required=True, help="results/<profile>/runs/<arm>")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.rl import results_ledger as L

        if args.action == "add":
            kw = {k: v for k, v in (("profile", args.profile), ("arm", args.arm)) if v}
            for path in L.add(args.run_dirs, args.into, **kw):
                print(f"minite ledger: {path}")
            return 0
        if args.action == "hash":
            print(L.current_hash(args.spec))
            return 0
        held = L.holds(args.into, args.profile, args.arm, args.seed, L.current_hash(args.spec))
        return 0 if held else 1

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
