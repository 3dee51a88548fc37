"""A sampling profiler for a jobq daemon process, every thread (cProfile sees only the main thread,
and a daemon's loops run in threads). No dependency: it reads `sys._current_frames()` every few
milliseconds and counts, per thread, the functions on the stack.

    python benchmarks/sampler.py OUT.json -- worker -A jobq.bench -P threads -c 64

runs `python -m jobq.cli worker ...` and, when it exits (SIGTERM stops it cleanly), writes OUT.json:
per thread, how many samples it was busy (not parked in a lock, a sleep, a select or a socket
read) and, for the busy ones, the functions by own samples and by samples anywhere on the stack.
"""

from __future__ import annotations

import collections
import json
import runpy
import sys
import threading
import time
from types import FrameType

INTERVAL_S = 0.005
_IDLE = {"wait", "acquire", "sleep", "select", "poll", "recv", "recv_into", "_wait_for_tstate_lock", "readinto"}


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename.rsplit('/site-packages/', 1)[-1]}:{code.co_name}"


def main() -> None:
    out = sys.argv[1]
    args = sys.argv[sys.argv.index("--") + 1 :]
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    anywhere: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    samples: collections.Counter[str] = collections.Counter()
    busy: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    me = threading.get_ident()

    def sample() -> None:
        while not stop.wait(INTERVAL_S):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me_sampler[0]:
                    continue
                name = names.get(ident, "?")
                name = "pool" if name.startswith(("ThreadPoolExecutor", "jobq-pool")) else name
                samples[name] += 1
                if frame.f_code.co_name in _IDLE:
                    continue
                busy[name] += 1
                own[name][_where(frame)] += 1
                seen = set()
                f: FrameType | None = frame
                while f is not None:
                    key = _where(f)
                    if key not in seen:
                        anywhere[name][key] += 1
                        seen.add(key)
                    f = f.f_back

    me_sampler = [0]
    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    me_sampler[0] = sampler.ident or 0
    del me
    sys.argv = ["jobq", *args]
    started = time.monotonic()
    try:
        runpy.run_module("jobq.cli", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        stop.set()
        sampler.join(1)
        doc = {
            "interval_s": INTERVAL_S,
            "wall_s": time.monotonic() - started,
            "threads": {
                name: {
                    "samples": samples[name],
                    "busy": busy[name],
                    "own": own[name].most_common(40),
                    "anywhere": anywhere[name].most_common(60),
                }
                for name in samples
            },
        }
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
