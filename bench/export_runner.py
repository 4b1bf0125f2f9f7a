"""The jax-free runner of an exported learner against the jax learner, side by side in one run.

    python bench/export_runner.py [--steps 2000] [--rounds 3] [--pin-cpu 0] [--md FILE]

For the default learner (float64) and GRU-64 D-RTRL (float32), both exported for this CPU
(``streamtrace export --target host``): each round starts a fresh process per side, runner
then jax, and measures process start to the first answer (the interpreter's start, imports,
loading the folder or building and compiling the learner, one step), the median and p99 of
``steps`` steps (after 50 unmeasured ones) and the peak RSS. The jax side steps through
``learner.programs.run``, the engine's own call (no validation), without the engine's
persistent compile cache. Each ratio is the median over rounds of runner / jax.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRU64 = '[model]\nstack = "gru"\nn_hidden = 64\n[learning]\nalgorithm = "d-rtrl"\n'

CHILD = r"""
import json, os, sys, time
side, where, series, pin = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if pin >= 0:
    os.sched_setaffinity(0, {pin})
import numpy as np
xs = np.load(series)
if side == "runner":
    from streamtrace.export.runner import Runner
    r = Runner(where)
    dt = np.dtype(r.manifest["inputs"]["x"][1])
    inputs = [np.full((1, 1), x, dt) for x in xs]
    call = r.step
else:
    from streamtrace.export.learner import learner_from_config
    _, learner = learner_from_config(where or None)
    p = learner.programs
    _, y, a = p.example_inputs(None)
    inputs = [np.full((1,) + learner.x_shape, x, learner.x_dtype) for x in xs]
    held = [tuple(learner.buffers)]

    def call(x):        # the state stays in jax's buffers, as the engine keeps it
        held[0], vec = p.run(held[0], x, y, a, a)
        return vec
call(inputs[0])
first = time.time()
for x in inputs[1:51]:
    call(x)
times = []
for x in inputs[51:]:
    t = time.perf_counter(); call(x); times.append(time.perf_counter() - t)
times.sort()
# the peak RSS of this program: VmHWM (ru_maxrss would keep the parent's peak across exec)
hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"first": first, "median_us": 1e6 * times[len(times) // 2],
                  "p99_us": 1e6 * times[int(0.99 * len(times))],
                  "rss_mb": hwm_kb / 1024}))
"""


def one(side: str, where: str, series: str, pin: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, side, where, series, str(pin)], capture_output=True,
                         text=True, env=env, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{side} failed: {out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["start_ms"] = 1e3 * (got.pop("first") - t0)
    return got


def measure(name: str, config: str, folder: str, series: str, args) -> dict:
    rounds = [(one("runner", folder, series, args.pin_cpu), one("jax", config, series, args.pin_cpu))
              for _ in range(args.rounds)]
    med = lambda side, k: statistics.median(r[side][k] for r in rounds)
    ratio = lambda k: statistics.median(r[0][k] / r[1][k] for r in rounds)
    keys = ("start_ms", "median_us", "p99_us", "rss_mb")
    return {"model": name, **{f"runner_{k}": med(0, k) for k in keys}, **{f"jax_{k}": med(1, k) for k in keys},
            **{f"ratio_{k}": ratio(k) for k in keys}}


def table(rows: list[dict], args) -> str:
    cpu = platform.processor() or platform.machine()
    head = (f"{args.rounds} rounds, {args.steps} steps per side per round; {cpu}, {os.cpu_count()} vCPU, Python {platform.python_version()}"
            + (f", pinned to CPU {args.pin_cpu}" if args.pin_cpu >= 0 else "") + "; medians over rounds\n\n")
    lines = ["| model | side | start to first answer ms | step median µs | step p99 µs | peak RSS MB |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        for side in ("runner", "jax", "ratio"):
            fmt = (lambda v: f"{v:.2f}") if side == "ratio" else (lambda v: f"{v:.1f}")
            label = {"runner": "runner (IREE)", "jax": "jax learner", "ratio": "runner / jax"}[side]
            lines.append(f"| {r['model']} | {label} | " + " | ".join(
                fmt(r[f"{side}_{k}"]) for k in ("start_ms", "median_us", "p99_us", "rss_mb")) + " |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pin-cpu", type=int, default=-1)
    ap.add_argument("--md", default="", help="also write the table here")
    args = ap.parse_args(argv)
    import numpy as np

    from streamtrace.export.write import export_learner
    from streamtrace.evaluation.tasks import mackey_glass
    work = Path(tempfile.mkdtemp(prefix="st-export-bench-"))
    series = str(work / "mackey_glass.npy")      # made here: the runner's process imports no task code
    np.save(series, mackey_glass(args.steps + 51))
    (work / "gru64.toml").write_text(GRU64)
    rows = []
    for name, config in (("default (float64)", ""), ("GRU-64 D-RTRL (float32)", str(work / "gru64.toml"))):
        folder = work / f"out{len(rows)}"
        export_learner(config or None, folder, "host")
        rows.append(measure(name, config, str(folder), series, args))
    text = table(rows, args)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
