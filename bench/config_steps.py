"""Step time of quality configs (bench/quality.py's CONFIGS) on evaluate's path, paired: the
configs take turns, a round of ``--steps`` Mackey-Glass steps each, and each round's per-step
median is divided by the first config's in the same round (so a slow spell of the machine
moves both). Steps run on the calling thread, as ``streamtrace evaluate`` runs them.

    .venv/bin/python bench/config_steps.py "reservoir alone" default small [--pin 0] [--rounds 15]

Prints per config: the median over rounds of the per-step median and p99 (µs) and the median
of the per-round ratios to the first config.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="names in bench/quality.py's CONFIGS; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per config per round")
    ap.add_argument("--pin", type=int, default=None, help="pin the process (and jax's threads) to this CPU")
    args = ap.parse_args(argv)
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})      # before jax starts its threads: they inherit it
    from streamtrace.learner.dispatch import inline_dispatch
    inline_dispatch()
    from quality import CONFIGS
    from timing import machine_line

    from streamtrace.recipe.build import build_learner
    from streamtrace.evaluation.scoring import default_config, task_config
    from streamtrace.commands.bench import percentiles, timed
    from streamtrace.evaluation.tasks import get_task
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; known: {sorted(CONFIGS)}")
    task = get_task("mackey-glass", None, 0)
    xs = task.inputs.astype(np.float64)
    warm = 300
    if warm + args.steps > len(xs):
        ap.error(f"--steps must be at most {len(xs) - warm}")
    learners = {}
    for name in args.configs:
        make = CONFIGS[name]
        cfg = default_config(task) if make is None else make(task) if callable(make) else make
        learners[name] = build_learner(task_config(task, cfg, 0))
        for i in range(warm):
            learners[name].step(xs[i])
    med = {n: [] for n in learners}
    p99 = {n: [] for n in learners}
    for _ in range(args.rounds):
        for name, learner in learners.items():
            inputs = iter(xs[warm:warm + args.steps])
            p = percentiles(timed(lambda: learner.step(next(inputs)), args.steps))
            med[name].append(p["p50"])
            p99[name].append(p["p99"])
    base = np.array(med[args.configs[0]])
    print(f"# {machine_line()}; {'pinned to CPU %d' % args.pin if args.pin is not None else 'unpinned'}; "
          f"{args.rounds} rounds of {args.steps} steps")
    print("| config | median µs | p99 µs | ratio to first (median of rounds) |")
    print("|---|---:|---:|---:|")
    for name in learners:
        ratio = np.median(np.array(med[name]) / base)
        print(f"| {name} | {np.median(med[name]):.0f} | {np.median(p99[name]):.0f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
