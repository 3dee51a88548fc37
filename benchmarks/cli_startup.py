"""How long `jobq list` (and `jobq --help`) take, start to exit, on the embedded default.

    python benchmarks/cli_startup.py [--runs 20] [--jobs 20] [--compare [LABEL=]OTHER_JOBQ ...]

Makes a SQLite store with `--jobs` jobs in a temporary directory, then runs each command `--runs`
times, the commands interleaved (on a shared machine every command sees the same load), and
prints one table: per command, the median and the range of the child's CPU time (user + system,
less sensitive to other processes than the wall time) and of the wall time, and each command's
ratio to the first executable's. `--compare` adds the same commands with another `jobq`
executable (another checkout's venv, installed the same way), labelled LABEL (default: its
venv's folder). Output is piped, as a script's would be (240 columns, no styles). The raw figures
go to benchmarks/results/cli-startup-<time>.json. Target (issue 11): `jobq list` ≤ 150 ms wall
on an idle machine.
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
from typing import Any

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


def _label(spec: str) -> tuple[str, str]:
    """`LABEL=PATH`, or a bare path labelled by its venv's folder (`/x/wt-main/.venv/bin/jobq` -> wt-main)."""
    label, sep, path = spec.partition("=")
    if sep:
        return label, path
    parts = Path(spec).resolve().parts
    return (parts[-4] if len(parts) >= 4 and parts[-3] == ".venv" else parts[-3] if len(parts) >= 3 else spec), spec


def _figure(stats: dict[str, float]) -> str:
    return f"{stats['median']:7.1f} ({stats['min']:.1f}-{stats['max']:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--compare", nargs="*", default=[], help="other jobq executables to run alike, [LABEL=]PATH")
    args = parser.parse_args()
    own = shutil.which("jobq", path=str(Path(sys.executable).parent)) or "jobq"
    executables = [("this", own), *(_label(spec) for spec in args.compare)]
    workdir = tempfile.mkdtemp(prefix="jobq-startup-")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir}
    subprocess.run([own, "init"], cwd=workdir, env=env, check=True, capture_output=True)
    for i in range(args.jobs):
        schedule = ["--cron", f"{i % 60} 2 * * *"] if i % 2 else ["--in", f"{i + 1}h"]
        subprocess.run(
            [own, "schedule", "bench.task", *schedule], cwd=workdir, env=env, check=True, capture_output=True
        )
    commands = {f"{label}: jobq {' '.join(c)}": [exe, *c] for c in (["list"], ["--help"]) for label, exe in executables}
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
        "python": sys.version.split()[0],
        "executables": dict(executables),
        "commands": {
            name: {"wall_ms": _stats(w), "cpu_ms": _stats(c), "wall_raw": w, "cpu_raw": c}
            for name, (w, c) in samples.items()
        },
    }
    shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cli-startup-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=1))
    _print_table(report, [label for label, _ in executables])
    print(f"raw figures: {out}")


def _print_table(report: dict[str, Any], labels: list[str]) -> None:
    before, after = report["loadavg_before"], report["loadavg_after"]
    print(
        f"jobq start-up, {report['runs']} interleaved runs per command, {report['jobs']} jobs in the store, "
        f"Python {report['python']}, {report['cpus']} CPUs; load average {before[0]:.2f} -> {after[0]:.2f}"
    )
    name_width = max(len(n) for n in report["commands"])
    cpu, wall = "CPU ms, median (min-max)", "wall ms, median (min-max)"
    print(f"{'command':<{name_width}}  {cpu:<26}  {wall:<26}  {labels[0]} / it: CPU, wall")
    for name, figures in report["commands"].items():
        label, _, command = name.partition(": ")
        own = report["commands"][f"{labels[0]}: {command}"]
        ratio = ""
        if label != labels[0]:
            ratio = (
                f"{own['cpu_ms']['median'] / figures['cpu_ms']['median']:.2f}x, "
                f"{own['wall_ms']['median'] / figures['wall_ms']['median']:.2f}x"
            )
        print(f"{name:<{name_width}}  {_figure(figures['cpu_ms']):<26}  {_figure(figures['wall_ms']):<26}  {ratio}")
    print("target (issue 11): jobq list ≤ 150 ms wall on an idle machine")


if __name__ == "__main__":
    main()
