"""Where a spike's time goes: the W2 spike (10,000 runs due at one instant) with the scanner and
the worker under the sampling profiler (`sampler.py`, every thread), on a chosen stack.

    python benchmarks/profile_spike.py --stack sqlite --runs 10000 --lead 45

Writes benchmarks/results/spike-<stack>-<role>.json and prints, per thread, the share of samples
it was busy and its top functions, with the spike's lateness.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import STACKS, stack

from jobq.bench import _LOG_DIR_VARIABLE, Bench, _env
from jobq.settings import Settings
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"


class ProfiledBench(Bench):
    def __init__(self, *args: object, name: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.name = name

    @contextmanager
    def _daemons(self) -> Iterator[Path]:
        logs = Path(tempfile.mkdtemp(prefix="executed-", dir=self.workdir))
        env = {**os.environ, **_env(self.d.settings), _LOG_DIR_VARIABLE: str(logs), "JOBQ_LOG_LEVEL": "WARNING"}

        def profiled(role: str, *args: str) -> list[str]:
            out = RESULTS / f"spike-{self.name}-{role}.json"
            return [sys.executable, str(Path(__file__).resolve().parent / "sampler.py"), str(out), "--", role, *args]

        jobq = [sys.executable, "-m", "jobq.cli"]
        commands = [[*jobq, "beat"], profiled("scanner"), [*jobq, "reaper"]]
        commands.append(profiled("worker", "-A", "jobq.bench", "-P", "threads", "-c", str(self.concurrency)))
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL) for c in commands]
        try:
            yield logs
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=STACKS, default="sqlite")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--lead", type=float, default=15.0, help="seconds between submitting and the due time")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    with stack(args.stack, log_level="WARNING") as urls:
        d = connect(Settings.load(urls, env={}))
        try:
            result = ProfiledBench(d, concurrency=64, name=args.stack).spike(args.runs, lead_s=args.lead)
        finally:
            d.close()
    print(result.name, "dispatch", result.dispatch_lateness_ms, "start", result.start_lateness_ms)
    for role in ("scanner", "worker"):
        doc = json.loads((RESULTS / f"spike-{args.stack}-{role}.json").read_text())
        print(f"\n===== {role}: {doc['wall_s']:.1f} s, one sample every {doc['interval_s'] * 1000:g} ms")
        for name, t in sorted(doc["threads"].items(), key=lambda kv: -kv[1]["busy"]):
            if not t["busy"]:
                continue
            print(f"\n--- thread {name}: busy in {t['busy']} of {t['samples']} samples")
            print("  by samples anywhere on the stack:")
            for where, n in t["anywhere"][: args.top]:
                print(f"    {n:6d} {100 * n / t['busy']:5.1f}%  {where}")
            print("  by own samples:")
            for where, n in t["own"][:15]:
                print(f"    {n:6d} {100 * n / t['busy']:5.1f}%  {where}")


if __name__ == "__main__":
    main()
