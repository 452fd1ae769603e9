"""gpushare's CreateContainer handling, this tree against an earlier revision,
in one run: `bench/handler_latency.py` runs in each tree by turns (a fresh
process each round, the two trees alternating, so the machine's load falls on
both alike), and the per-round p50s are summarised.

    .venv/bin/python bench/handler_ab.py --base REV [--rounds 6] [--requests 1000]

REV's tree is exported with `git archive` into a temporary folder and run
with this tree's interpreter; each tree runs its own copy of the benchmark.
Prints, per arm (null, gpushare, gpushare-plain), the median over rounds of
each tree's p50 and the ratio this/base; `--json PATH` writes them
(bench/report_common.py's convention).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from report_common import write_json

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("null", "gpushare", "gpushare-plain")


def export(rev: str, into: Path) -> Path:
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev], check=True)
    tree = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def one_round(tree: Path, requests: int, out: Path) -> dict[str, float]:
    subprocess.run(
        [sys.executable, str(tree / "bench" / "handler_latency.py"), "--requests", str(requests)]
        + ["--json", str(out)],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    figures = json.loads(out.read_text())["figures"]
    return {arm: float(figures[f"{arm} p50_us"]) for arm in ARMS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier revision (a git rev)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    p50s: dict[str, dict[str, list[float]]] = {t: {a: [] for a in ARMS} for t in ("base", "this")}
    with tempfile.TemporaryDirectory(prefix="gs-handler-ab-") as tmp:
        trees = {"base": export(args.base, Path(tmp)), "this": ROOT}
        for i in range(args.rounds):
            order = ("base", "this") if i % 2 == 0 else ("this", "base")
            for name in order:
                for arm, p50 in one_round(trees[name], args.requests, Path(tmp) / "r.json").items():
                    p50s[name][arm].append(p50)
            print(
                f"round {i + 1}: "
                + ", ".join(f"{t} gpushare {p50s[t]['gpushare'][-1]:.0f} us" for t in order),
                flush=True,
            )
    figures: dict[str, float] = {}
    print(f"p50 per round, median of {args.rounds} rounds ({args.requests} requests each):")
    for arm in ARMS:
        base, this = (statistics.median(p50s[t][arm]) for t in ("base", "this"))
        figures |= {f"{arm} base p50_us": base, f"{arm} this p50_us": this}
        figures[f"{arm} ratio"] = this / base
        print(f"  {arm:15} base {base:6.1f} us, this {this:6.1f} us, this/base {this / base:.3f}")
    write_json(args.json, "handler_ab", figures, base=args.base, rounds=p50s)


if __name__ == "__main__":
    main()
