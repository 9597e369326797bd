"""Side by side: graph µs of each row in several ``flashdecode bench`` results.json (A/B runs of one backend).

    python scripts/ab_table.py base=a/results.json evict=b/results.json base2=c/results.json [--backend auto_plan]

Prints one line per row with each run's µs and, for every run after the first, its ratio to the first.
"""

import argparse
import json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", help="name=path/to/results.json")
    parser.add_argument("--backend", default=None, help="only this backend's rows (default: every backend)")
    args = parser.parse_args()
    runs = [run.split("=", 1) for run in args.runs]
    tables = []
    for _, path in runs:
        results = json.load(open(path))["results"]
        tables.append({
            (r["row"], r["backend"]): r.get("graph_us") for r in results
            if args.backend in (None, r["backend"]) and r.get("status") == "ok"
        })  # fmt: skip
    keys = [key for key in tables[0] if all(key in t for t in tables)]
    names = [name for name, _ in runs]
    print(f"{'row':>28} {'backend':>10} " + " ".join(f"{n:>9}" for n in names) + " " +
          " ".join(f"{n + '/' + names[0]:>14}" for n in names[1:]))  # fmt: skip
    for key in keys:
        us = [t[key] for t in tables]
        ratios = " ".join(f"{u / us[0]:>14.3f}" for u in us[1:])
        print(f"{key[0]:>28} {key[1]:>10} " + " ".join(f"{u:>9.1f}" for u in us) + " " + ratios)


if __name__ == "__main__":
    main()
