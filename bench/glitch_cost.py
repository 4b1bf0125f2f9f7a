"""What the glitch guards cost on clean data, paired: each learner's compiled step with the
outlier screen and the rollback (learner/screen.py, learner/rollback.py) against the same
learner compiled without them, timed in turn round after round in one process.

Sides: the default learner (one slot, float64, Mackey-Glass's config, as ``evaluate`` builds
it) with ``[screen]`` on (the default) and the rollback, against ``[screen] policy = "off"`` and
no rollback; and GRU-64 / GRU-256 learners (the speed targets' models) with and without the
rollback (they have no screen unless a config asks).

    .venv/bin/python bench/glitch_cost.py [--pin-cpu 0] [--rounds 9] [--round-s 0.3]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


@contextlib.contextmanager
def no_rollback():
    """Programs compiled inside step as before the rollback existed (no gate after the step)."""
    import jax.numpy as jnp

    import streamtrace.learner.programs as programs
    saved = programs.gate
    programs.gate = lambda layout, before, after, active: (after, jnp.zeros(active.shape, jnp.int32))
    try:
        yield
    finally:
        programs.gate = saved


def default_sides() -> dict:
    from timing import step_call        # compiles its program now (inside no_rollback for a bare side)
    from streamtrace.recipe.build import build_learner
    from streamtrace.evaluation.scoring import default_config, task_config
    from streamtrace.evaluation.tasks import get_task
    task = get_task("mackey-glass", None, 0)
    x, y = task.inputs[300].astype(np.float64), np.zeros(1)
    guarded = build_learner(task_config(task, default_config(task), 0))
    for v in task.inputs[:300]:      # past the warm-up, as a running stream is
        guarded.step(v)
    with no_rollback():              # compiled inside: no gate
        bare = build_learner(task_config(task, {**default_config(task), "screen": {"policy": "off"}}, 0))
        for v in task.inputs[:300]:
            bare.step(v)
        sides = {"default, guarded": step_call(guarded, x, y), "default, bare": step_call(bare, x, y)}
    return sides


def gru_sides(hidden, algo, slots) -> dict:
    from timing import stack_step
    out = {f"gru{hidden}-{algo}-{slots or 1}, guarded": stack_step("gru", hidden, algo, slots)}
    with no_rollback():      # stack_step compiles its program before it returns
        out[f"gru{hidden}-{algo}-{slots or 1}, bare"] = stack_step("gru", hidden, algo, slots)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pin-cpu", type=int, default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--round-s", type=float, default=0.3, help="seconds per side per round")
    args = p.parse_args(argv)
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    from paired import paired
    from timing import machine_line, percentiles, timed
    groups = [default_sides, lambda: gru_sides(64, "d-rtrl", None), lambda: gru_sides(256, "es-d-rtrl", None),
              lambda: gru_sides(256, "d-rtrl", 64)]
    print(f"# {machine_line()}; {args.rounds} paired rounds of {args.round_s} s per side")
    print("| learner | guarded p50 µs | bare p50 µs | guarded / bare p50 (median of rounds) | "
          "guarded p99 µs | bare p99 µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for make in groups:
        sides = make()
        med = paired(sides, args.rounds, args.round_s)
        (g, gv), (b, bv) = med.items()
        ratio = float(np.median(np.array(gv) / np.array(bv)))
        calls = max(50, int(2 * args.round_s * 1e6 / max(np.median(bv), 1.0)))
        p99 = [percentiles(timed(f, calls))["p99"] for f in sides.values()]     # one longer run each
        print(f"| {g.rsplit(',', 1)[0]} | {np.median(gv):.1f} | {np.median(bv):.1f} | {ratio:.3f} | "
              f"{p99[0]:.1f} | {p99[1]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
