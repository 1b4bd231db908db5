"""Time the test suite's tiers, one copy alone or several at once, against their budgets.

    python benchmarks/suite.py [--copies 2] [--tier quick|full|both]

Runs the README's test command (`python -m pytest`, from the checkout) and its quick tier
(`-m "not e2e"`), COPIES at a time, and prints each copy's wall time, its pytest summary line
and the ratio of the slowest copy to the budget: the quick tier 2 minutes, the full suite 10
minutes alone and 20 with two copies at once. A ratio above 1 is over budget.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = {"quick": ["-m", "not e2e"], "full": []}
#: Seconds each tier may take: alone, and with two copies at once.
BUDGET = {"quick": (120, 240), "full": (600, 1200)}
SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


def run_copy(tier: str) -> tuple[float, str, int]:
    """One run of the tier: wall seconds, pytest's summary line, exit code."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIERS[tier]],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    found = SUMMARY.findall(done.stdout)
    return time.monotonic() - start, found[-1][0] if found else done.stdout[-300:], done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=1, help="copies run at once (default 1)")
    parser.add_argument("--tier", choices=["quick", "full", "both"], default="both")
    args = parser.parse_args()
    failed = False
    for tier in ["quick", "full"] if args.tier == "both" else [args.tier]:
        with ThreadPoolExecutor(args.copies) as pool:
            runs = list(pool.map(run_copy, [tier] * args.copies))
        budget = BUDGET[tier][0 if args.copies == 1 else 1]
        for n, (seconds, summary, code) in enumerate(runs, 1):
            print(f"{tier}: copy {n} of {args.copies}: {seconds:.0f} s, exit {code}: {summary}")
            failed |= code != 0
        slowest = max(seconds for seconds, _, _ in runs)
        print(f"{tier}: slowest {slowest:.0f} s against a budget of {budget} s: {slowest / budget:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
