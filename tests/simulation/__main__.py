"""The long search: `python -m tests.simulation --seeds 100000 [--from N] [--steps 2000] [--backend memory|sqlite]`,
or a replay: `python -m tests.simulation --trace FILE [--backend ...]` (a trace printed by a failing seed).

Runs seeds until the budget is spent or one fails; a failure is shrunk and printed with its trace,
and the exit status is 1."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import simulation  # noqa: F401 - puts tests/ on sys.path for the helpers the world imports
from simulation.runner import describe, replay, run_seed, shrink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--from", dest="first", type=int, default=0, help="the first seed")
    parser.add_argument("--steps", type=int, default=2000, help="actions per seed")
    parser.add_argument("--backend", choices=["memory", "sqlite", "both"], default="both")
    parser.add_argument("--trace", type=Path, help="replay this trace (JSON) instead of searching")
    parser.add_argument("--verbose", action="store_true", help="show the daemons' logs")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.disable(logging.CRITICAL)
    if args.trace is not None:
        backend = "memory" if args.backend == "both" else args.backend
        result = replay(json.loads(args.trace.read_text()), backend=backend)
        print("ok" if result.ok else describe(result))
        return 0 if result.ok else 1
    started = time.monotonic()
    for n, seed in enumerate(range(args.first, args.first + args.seeds), start=1):
        backend = args.backend if args.backend != "both" else ("sqlite" if seed % 5 == 4 else "memory")
        result = run_seed(seed, args.steps, backend)
        if not result.ok:
            print(describe(shrink(result)))
            return 1
        if n % 100 == 0:
            print(f"{n} seeds ok ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(f"{args.seeds} seeds x {args.steps} steps: no violation ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
