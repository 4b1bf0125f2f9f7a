"""What a change to the experts combiner costs the default learner's step, paired: the default
(one slot, float64, Mackey-Glass's config, as ``evaluate`` builds it) with this tree's combiner
against the same learner with the combiner of an earlier commit (its learner/experts.py,
period.py, lagged_rls.py and flat_state.py where it has them, read with ``git show``) and
without seasons (``[combine] max_period = 0``, that commit's default where it predates the
detection), and this tree's default without seasons, timed in turn round after round in one
process; ratios are medians of the paired rounds' ratios. ``--engine`` adds the engine's one-slot program (a slot axis, weights per stream, the
step vmapped over the slots: ``build_learner(.., slots=1, shared_weights=False)``) of this
tree's default and of its default without seasons.

    .venv/bin/python bench/combiner_cost.py --before b029070 [--pin-cpu 0] [--rounds 9] [--round-s 0.3] [--engine]
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parent.parent
MODULES = ("experts", "period", "lagged_rls", "flat_state")


def combiner_at(commit: str):
    """The ``experts`` factory of ``commit``'s learner/experts.py (with the modules it imports)."""
    pkg = Path(tempfile.mkdtemp(prefix="combiner-")) / "combiner_before"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in MODULES:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:streamtrace/learner/{name}.py"],
                              capture_output=True, text=True)
        if text.returncode == 0:
            (pkg / f"{name}.py").write_text(text.stdout)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("combiner_before.experts").experts


def sides(before: str, engine: bool = False) -> dict:
    import streamtrace.recipe.build as build
    from timing import step_call
    from streamtrace.evaluation.scoring import default_config, task_config
    from streamtrace.evaluation.tasks import get_task
    task = get_task("mackey-glass", None, 0)
    x, y = task.inputs[300].astype(np.float64), np.zeros(1)

    def side(config, factory=None, slots=None):
        saved = build.experts
        build.experts = factory or saved
        try:
            learner = build.build_learner(task_config(task, config, 0), slots=slots, shared_weights=slots is None)
            lead = (1,) if slots else ()
            for v in task.inputs[:300]:      # past the warm-up, as a running stream is
                learner.step(v.reshape(lead + v.shape))
            return step_call(learner, x.reshape(lead + x.shape), y.reshape(lead + y.shape))  # compiled now
        finally:
            build.experts = saved
    cfg = default_config(task)
    off = {**cfg, "combine": {**cfg["combine"], "max_period": 0}}
    out = {"default": side(cfg), f"default at {before}": side(off, combiner_at(before)),
           "default without seasons": side(off)}
    if engine:
        out.update({"engine's one slot: default": side(cfg, slots=1),
                    "engine's one slot: default without seasons": side(off, slots=1)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the commit whose combiner is the baseline")
    p.add_argument("--pin-cpu", type=int, default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--round-s", type=float, default=0.3, help="seconds per side per round")
    p.add_argument("--engine", action="store_true", help="the engine's one-slot programs too")
    args = p.parse_args(argv)
    from paired import paired
    from timing import machine_line, percentiles, pin, timed
    pin(args.pin_cpu)
    fns = sides(args.before, args.engine)
    med = paired(fns, args.rounds, args.round_s)
    base = f"default at {args.before}"
    ratio = lambda name, of: float(np.median(np.array(med[name]) / np.array(med[of])))
    print(f"# {machine_line()}; {args.rounds} paired rounds of {args.round_s} s per side")
    print(f"| learner | p50 µs (median of rounds) | p99 µs | / {base} | / default without seasons |"
          " / its own kind without seasons |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, f in fns.items():
        p99 = percentiles(timed(f, max(50, int(2 * args.round_s * 1e6 / max(np.median(med[name]), 1.0)))))["p99"]
        own = name.split(":")[0] + ": default without seasons" if ":" in name else "default without seasons"
        print(f"| {name} | {np.median(med[name]):.1f} | {p99:.1f} | {ratio(name, base):.3f} "
              f"| {ratio(name, 'default without seasons'):.3f} | {ratio(name, own):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
