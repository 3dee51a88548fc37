"""CPU seconds per run across every jobq process and the servers, and where it goes by stage.

    python benchmarks/cpu_per_run.py --stack sqlite --runs 5000 --repeat 3 --workers 1
    python benchmarks/cpu_per_run.py --stack postgres-redis --runs 5000 --profile

W1's shape (instant no-op runs submitted one `submit` each, then beat, scanner, reaper and the
workers started as processes), measuring CPU time rather than wall time, which a shared machine
distorts far less:

- the load generator's own CPU while it submits (`submit`);
- every daemon process, from `getrusage(RUSAGE_CHILDREN)` once they have exited;
- PostgreSQL: the backends serving this deployment (found in `pg_stat_activity` by the
  deployment's schema name in their queries), sampled from `/proc` while they live;
- Redis: the server's `used_cpu_user + used_cpu_sys` (the whole server: other clients count too).

Two figures per repetition: the whole run (start-up of every process included, so it depends on
the run count) and the steady state, from 10% to 90% of the runs executed (daemons and servers;
W1's runs are published at submission, so submission is over and the scanner idle by then).

`--profile` instead attaches `py-spy record --gil` to every daemon for the steady state (and to this
process while it submits) and splits the samples by stage: submit, claim/dispatch (the scanner, and the worker receiving
messages), start, execute, complete, history, and the rest (loops, heartbeats, beat and reaper).
Profiling costs CPU itself, so the CPU figures of a profiled repetition are not reported.

Results go to benchmarks/results/cpu-per-run-<stack>-w<N>-<date>.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import STACKS, stack

from jobq.bench import NOOP, Bench, _count, _env
from jobq.settings import Settings
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"
_TICKS = os.sysconf("SC_CLK_TCK")

# Stages, tried in this order against each sampled stack (innermost frames last): the first whose
# marker appears in the stack takes the sample. History first: it is called from start and complete.
_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("history", ("history/", "def record", "(record ")),
    ("execute", ("execution.py", "bench.py")),
    ("complete", ("completer.py",)),
    ("start", ("_start (", "_fresh (", "_jobs (", "_sort (", "decode (")),
    ("claim/dispatch", ("consume (", "broker.py", "scanner.py")),
    ("submit", ("submission.py", "client.py")),
)


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


class _PostgresBackends:
    """CPU of the PostgreSQL backends whose queries name `schema`, sampled every 0.2 s."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _PostgresBackends:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE query LIKE %s", [f"%{self.schema}%"]
                ).fetchall()
                for (pid,) in rows:
                    cpu = _proc_cpu_s(pid)
                    if cpu is not None:
                        self.first.setdefault(pid, cpu)
                        self.last[pid] = cpu
                self._stop.wait(0.2)

    @property
    def cpu_s(self) -> float:
        # A backend first seen mid-run started with the run (connections open with the daemons).
        return sum(self.last.values())


def _redis_cpu_s(url: str) -> float:
    import redis

    info = redis.Redis.from_url(url.split("?", maxsplit=1)[0]).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class _MeasuredBench(Bench):
    """W1 with every process's CPU counted, or profiled with py-spy (`profile_dir`)."""

    def __init__(self, *args: Any, profile_dir: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self.spies: list[subprocess.Popen[bytes]] = []
        self.submit_cpu_s = 0.0
        self.daemons_cpu_s = 0.0
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.servers: Any = lambda: 0.0  # CPU seconds of the servers so far (set by `_once`)
        self.window: dict[str, float] = {}
        self.window_spies = 0

    def _snapshot(self, done: int) -> dict[str, float]:
        daemons = sum(_proc_cpu_s(p.pid) or 0.0 for p in self.procs.values())
        return {"done": done, "daemons": daemons, "servers": self.servers()}

    def _profile_window(self, *, first: bool) -> None:
        """Attach py-spy to every daemon at the first mark; stop it (it writes its file) at the second."""
        if first:
            self.window_spies = len(self.spies)
            for role, proc in self.procs.items():
                self._spy(proc.pid, role)
            return
        for spy in self.spies[self.window_spies :]:
            spy.send_signal(signal.SIGINT)

    def _wait(self, logs: Path, n: int, phase: str, timeout_s: float = 900.0) -> None:
        """Wait for all `n` runs, snapshotting CPU when 10% and 90% of them have run: the steady
        state between excludes start-up (imports, connections) and the tail."""
        marks = [max(1, n // 10), n * 9 // 10]
        snaps: list[dict[str, float]] = []
        deadline = time.monotonic() + timeout_s
        while (done := _count(logs)) < n:
            if len(snaps) < 2 and done >= marks[len(snaps)]:
                snaps.append(self._snapshot(done))
                if self.profile_dir is not None:
                    self._profile_window(first=len(snaps) == 1)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {done} of {n} runs executed within {timeout_s} s")
            time.sleep(0.01)
        if len(snaps) == 2:
            runs = snaps[1]["done"] - snaps[0]["done"]
            self.window = {k: (snaps[1][k] - snaps[0][k]) / runs * 1e6 for k in ("daemons", "servers")}

    def _spy(self, pid: int, name: str) -> None:
        assert self.profile_dir is not None
        out = self.profile_dir / f"{name}.txt"
        cmd = ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking", "--gil"]
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
        self.spies.append(subprocess.Popen([spy, *cmd[1:], "-o", str(out)], stdout=subprocess.DEVNULL))

    def _submit(self, specs: Any, *, bulk: bool = False) -> Any:
        spy_count = len(self.spies)
        if self.profile_dir is not None:
            self._spy(os.getpid(), "submit")
            time.sleep(0.5)
        before = _cpu_s(resource.getrusage(resource.RUSAGE_SELF))
        try:
            return super()._submit(specs, bulk=bulk)
        finally:
            self.submit_cpu_s = _cpu_s(resource.getrusage(resource.RUSAGE_SELF)) - before
            if self.profile_dir is not None:
                for spy in self.spies[spy_count:]:
                    spy.send_signal(signal.SIGINT)
                    spy.wait()

    @contextlib.contextmanager
    def _daemons(self) -> Iterator[Path]:
        logs = Path(tempfile.mkdtemp(prefix="executed-", dir=self.workdir))
        env = {**os.environ, **_env(self.d.settings), "JOBQ_BENCH_LOG_DIR": str(logs), "JOBQ_LOG_LEVEL": "WARNING"}
        jobq = [sys.executable, "-m", "jobq.cli"]
        roles = {"beat": [*jobq, "beat"], "scanner": [*jobq, "scanner"], "reaper": [*jobq, "reaper"]}
        worker = [*jobq, "worker", "-A", "jobq.bench", "-P", self.pool, "-c", str(self.concurrency)]
        roles.update({f"worker-{i}": worker for i in range(self.workers)})
        before = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
        procs = {role: subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL) for role, cmd in roles.items()}
        self.procs = procs
        try:
            yield logs
        finally:
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            for p in procs.values():
                p.wait(timeout=60)
            for spy in self.spies:
                spy.wait(timeout=60)
            self.daemons_cpu_s = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - before


def _once(stack_name: str, runs: int, workers: int, concurrency: int, profile_dir: Path | None) -> dict[str, Any]:
    with stack(stack_name, log_level="WARNING") as urls:
        d = connect(Settings.load(urls, env={}))
        bench = _MeasuredBench(d, workers=workers, concurrency=concurrency, profile_dir=profile_dir)
        schema = urls["store"].split("schema=")[1].split("&")[0] if "schema=" in urls["store"] else None
        redis_url = urls.get("broker") if stack_name == "postgres-redis" else None
        try:
            redis_before = _redis_cpu_s(redis_url) if redis_url else 0.0
            pg = _PostgresBackends(urls["store"].split("?")[0], schema) if schema else contextlib.nullcontext()

            def servers() -> float:
                pg_now = pg.cpu_s if isinstance(pg, _PostgresBackends) else 0.0
                return pg_now + (_redis_cpu_s(redis_url) if redis_url else 0.0)

            bench.servers = servers
            with pg:
                result = bench.instant(runs, task=NOOP)
            redis_s = _redis_cpu_s(redis_url) - redis_before if redis_url else 0.0
        finally:
            d.close()
    pg_s = pg.cpu_s if isinstance(pg, _PostgresBackends) else 0.0
    total = bench.submit_cpu_s + bench.daemons_cpu_s + pg_s + redis_s
    return {
        "runs": runs,
        "executed_once": result.executed_once,
        "runs_per_s": result.runs_per_s,
        "cpu_s": {"submit": bench.submit_cpu_s, "daemons": bench.daemons_cpu_s, "postgres": pg_s, "redis": redis_s},
        "cpu_us_per_run": {
            "total": total / runs * 1e6,
            "submit": bench.submit_cpu_s / runs * 1e6,
            "daemons": bench.daemons_cpu_s / runs * 1e6,
            "servers": (pg_s + redis_s) / runs * 1e6,
        },
        # Between 10% and 90% of the runs executed: no start-up, no tail. Submission is over by then.
        "steady_us_per_run": {**bench.window, "total": sum(bench.window.values())},
    }


def stage_of(stack_line: str, process: str) -> str:
    """The stage one py-spy sample belongs to (`stack_line` is its frames joined by `;`)."""
    if "importlib" in stack_line or "webhook_caller" in stack_line:
        return "start-up (imports, clients)"
    if process == "submit":
        return "submit"
    if process == "scanner":
        return "claim/dispatch"
    for name, markers in _STAGES:
        if any(marker in stack_line for marker in markers):
            return name
    return "other (loops, beat, reaper, idle polls)"


def summarise_profile(directory: Path) -> dict[str, Any]:
    """Samples by stage and the hottest functions (self time) of the worker processes."""
    stages: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for path in sorted(directory.glob("*.txt")):
        process = path.stem.split("-")[0]
        for line in path.read_text().splitlines():
            frames, _, count = line.rpartition(" ")
            if not count.isdigit() or not frames:
                continue  # a thread with no Python frame (py-spy sees it, but no code of ours runs)
            n = int(count)
            stages[stage_of(frames, process)] += n
            if process == "worker":
                leaves[frames.split(";")[-1].split(" (")[0]] += n
    total = sum(stages.values()) or 1
    worker_total = sum(leaves.values()) or 1
    return {
        "samples": total,
        "share_by_stage": {k: round(v / total, 3) for k, v in stages.most_common()},
        "worker_top_self": [(k, round(v / worker_total, 3)) for k, v in leaves.most_common(25)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=STACKS, default="sqlite")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--profile", action="store_true", help="py-spy every process; report shares by stage")
    parser.add_argument("--label", default="", help="added to the result file's name (e.g. before, after)")
    args = parser.parse_args()
    doc: dict[str, Any] = {
        "stack": args.stack,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "label": args.label,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.profile:
        directory = Path(tempfile.mkdtemp(prefix="jobq-cpu-profile-"))
        _once(args.stack, args.runs, args.workers, args.concurrency, directory)
        doc["profile"] = summarise_profile(directory)
        doc["profile_dir"] = str(directory)
        print(json.dumps(doc["profile"], indent=1))
    else:
        reps = []
        for i in range(args.repeat):
            rep = _once(args.stack, args.runs, args.workers, args.concurrency, None)
            reps.append(rep)
            per, steady = rep["cpu_us_per_run"], rep["steady_us_per_run"]
            print(
                f"  #{i + 1}: {per['total']:.0f} us CPU/run (submit {per['submit']:.0f}, daemons {per['daemons']:.0f}, "
                f"servers {per['servers']:.0f}); steady state: daemons {steady.get('daemons', 0):.0f}, servers "
                f"{steady.get('servers', 0):.0f}; {rep['runs_per_s']:,.0f} runs/s once={rep['executed_once']}",
                flush=True,
            )
        doc["repetitions"] = reps
        doc["cpu_us_per_run"] = {
            k: {
                "median": statistics.median(r["cpu_us_per_run"][k] for r in reps),
                "min": min(r["cpu_us_per_run"][k] for r in reps),
                "max": max(r["cpu_us_per_run"][k] for r in reps),
            }
            for k in reps[0]["cpu_us_per_run"]
        }
        doc["steady_us_per_run"] = {
            k: {
                "median": statistics.median(r["steady_us_per_run"][k] for r in reps),
                "min": min(r["steady_us_per_run"][k] for r in reps),
                "max": max(r["steady_us_per_run"][k] for r in reps),
            }
            for k in reps[0]["steady_us_per_run"]
        }
        print(json.dumps({"whole": doc["cpu_us_per_run"], "steady": doc["steady_us_per_run"]}, indent=1))
    doc["machine"]["load_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    kind = "cpu-profile" if args.profile else "cpu-per-run"
    label = f"-{args.label}" if args.label else ""
    path = RESULTS / f"{kind}-{args.stack}-w{args.workers}{label}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
