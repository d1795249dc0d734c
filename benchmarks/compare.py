"""Before/after: a benchmark script run on an earlier commit and on the working tree, in turn.

    python benchmarks/compare.py --base 3fc0759 --rounds 3 bench_reader.py --repeats 1
    python benchmarks/compare.py --base 3fc0759 --rounds 3 bench_convert.py --repeats 1

The earlier commit is checked out into a temporary git worktree; each round
runs the *current* benchmark script once with ``PYTHONPATH`` pointing at that
worktree's ``src`` (so ``import chute`` is the old code) and once with the
working tree's, in that order. The scripts use chute's public API only. Each
run's JSON is kept under ``--out``; the summary shows every numeric figure of
the script's ``summary`` (or top-level) object, the median over rounds, old
and new side by side, and new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def flatten(value, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON object, by dotted path."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {prefix.rstrip("."): float(value)}
    return {}


def run(script: str, args: list[str], src: str, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    command = [sys.executable, os.path.join(HERE, script), *args, "--json", out]
    print(f"$ PYTHONPATH={src} {' '.join(command)}", flush=True)
    subprocess.run(command, env=env, check=True)
    with open(out) as handle:
        body = json.load(handle)
    return body.get("summary", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "compare"))
    parser.add_argument("script", help="a benchmark script in benchmarks/")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    worktree = tempfile.mkdtemp(prefix="chute-base-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", worktree, args.base],
                   check=True)  # fmt: skip
    figures: dict[str, list[dict]] = {"old": [], "new": []}
    try:
        for number in range(args.rounds):
            for side, src in (
                ("old", os.path.join(worktree, "src")),
                ("new", os.path.join(ROOT, "src")),
            ):
                out = os.path.join(
                    args.out, f"{os.path.splitext(args.script)[0]}-{side}-{number}.json"
                )
                figures[side].append(flatten(run(args.script, args.args, src, out)))
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", worktree], check=False)
    names = [name for name in figures["new"][0] if all(name in f for f in figures["old"])]
    summary = {}
    print(f"\n{'figure':<70} {'old':>12} {'new':>12} {'new/old':>8}")
    for name in names:
        old = statistics.median(f[name] for f in figures["old"])
        new = statistics.median(f[name] for f in figures["new"])
        ratio = new / old if old else float("nan")
        summary[name] = {"old": old, "new": new, "new_over_old": ratio,
                         "old_runs": [f[name] for f in figures["old"]],
                         "new_runs": [f[name] for f in figures["new"]]}  # fmt: skip
        print(f"{name:<70} {old:>12.4g} {new:>12.4g} {ratio:>8.3f}")
    path = os.path.join(args.out, f"{os.path.splitext(args.script)[0]}-summary.json")
    with open(path, "w") as handle:
        json.dump({"base": args.base, "rounds": args.rounds, "figures": summary}, handle, indent=1)
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
