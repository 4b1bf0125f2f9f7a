"""False alarms of the default outlier screen (``[screen]``, learner/screen.py) on every series
``make quality`` scores: each task's inputs, seeds 0-2, run through the screen alone (its own
check and update, in a scan), every flagged step counted. A clean series should have none: a
false alarm is a step the learner neither learns from nor is scored on.

    .venv/bin/python bench/screen_alarms.py [--threshold 30]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def alarms(x: np.ndarray, threshold: float) -> int:
    """Steps of x (T, C) with any channel flagged by ``screen(threshold=...)``."""
    import jax
    import jax.numpy as jnp

    from streamtrace.learner.screen import screen
    sc = screen(threshold=threshold)
    on = jnp.ones(1, bool)

    def step(s, row):
        flag, _ = sc.check(s, row[None])
        return sc.observe(s, row[None], flag, on), jnp.any(flag)
    _, flags = jax.lax.scan(step, sc.init(1, x.shape[1], jnp.float32), jnp.asarray(x, jnp.float32))
    return int(np.asarray(flags).sum())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threshold", type=float, default=30.0)
    args = p.parse_args(argv)
    from quality import TASKS
    from timing import machine_line

    from streamtrace.evaluation.tasks import get_task
    print(f"# {machine_line()}; screen threshold {args.threshold:g}, seeds 0-2")
    print("| task | steps x channels | steps flagged (seed 0, 1, 2) |")
    print("|---|---:|---:|")
    for name in TASKS:
        counts, shape = [], None
        for seed in (0, 1, 2):
            x = np.asarray(get_task(name, None, seed).inputs, np.float64)
            x = x.reshape(len(x), -1)
            shape = x.shape
            counts.append(alarms(x, args.threshold))
        print(f"| {name} | {shape[0]} x {shape[1]} | {', '.join(map(str, counts))} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
