"""How long `jobq list` (and `jobq --help`) take, start to exit, on the embedded default.

    python benchmarks/cli_startup.py [--runs 20] [--jobs 20] [--compare OTHER_JOBQ ...]

Makes a SQLite store with `--jobs` jobs in a temporary directory, then runs each command `--runs`
times, the commands interleaved (on a shared machine every command sees the same load), and
prints, per command, the median and the range of the wall time and of the child's CPU time
(user + system, less sensitive to other processes than the wall time). `--compare` adds the
same commands with another `jobq` executable (another checkout's venv), for a ratio within one
run. The raw figures go to benchmarks/results/cli-startup-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _one(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--compare", nargs="*", default=[], help="other jobq executables to run alike")
    args = parser.parse_args()
    own = shutil.which("jobq", path=str(Path(sys.executable).parent)) or "jobq"
    executables = [own, *args.compare]
    workdir = tempfile.mkdtemp(prefix="jobq-startup-")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir}
    subprocess.run([own, "init"], cwd=workdir, env=env, check=True, capture_output=True)
    for i in range(args.jobs):
        schedule = ["--cron", f"{i % 60} 2 * * *"] if i % 2 else ["--in", f"{i + 1}h"]
        subprocess.run(
            [own, "schedule", "bench.task", *schedule], cwd=workdir, env=env, check=True, capture_output=True
        )
    commands = {f"{exe} {' '.join(c)}": [exe, *c] for exe in executables for c in (["list"], ["--help"])}
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in commands}
    for cmd in commands.values():  # one warm-up each: the page cache, .pyc files
        _one(cmd, workdir, env)
    load_before = os.getloadavg()
    for _ in range(args.runs):
        for name, cmd in commands.items():
            wall, cpu = _one(cmd, workdir, env)
            samples[name][0].append(wall)
            samples[name][1].append(cpu)
    report = {
        "runs": args.runs,
        "jobs": args.jobs,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "commands": {
            name: {"wall_ms": _stats(w), "cpu_ms": _stats(c), "wall_raw": w, "cpu_raw": c}
            for name, (w, c) in samples.items()
        },
    }
    shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cli-startup-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=1))
    for name, figures in report["commands"].items():
        print(f"{name}: wall {figures['wall_ms']} ms, cpu {figures['cpu_ms']} ms")
    print(f"load average {load_before} -> {report['loadavg_after']}; raw figures in {out}")


if __name__ == "__main__":
    main()
