"""What deterministic steps cost: a step of per-slot models as it is now (in pairs of slots, a
loop over the pairs, idle pairs skipped: learner/programs.py ``_in_pairs``) against the same
learner's step compiled as it was before (all slots vmapped at once),
timed in paired rounds in one process (bench/paired.py's ``paired``).

    .venv/bin/python bench/determinism_cost.py [--pin-cpu 0] [--rounds 7] [--md F]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

# (label, hidden, algorithm, slots, shared weights)
CASES = [("GRU-64 d-rtrl, 16 slots, a model each (engine default)", 64, "d-rtrl", 16, False),
         ("GRU-64 d-rtrl, 16 slots, a model each, 1 busy", 64, "d-rtrl", -16, False),
         ("GRU-64 es-d-rtrl, 64 slots, a model each", 64, "es-d-rtrl", 64, False),
         ("GRU-256 d-rtrl, 16 slots, a model each", 256, "d-rtrl", 16, False)]
N_IN, N_OUT = 4, 1


def before(learner):
    """The learner's one-step program as it was compiled before: all slots vmapped."""
    layout, squeeze = learner.layout, learner.slots is None

    def core(state, x, y, active, learn):       # per-slot models were vmapped over all slots
        step = learner.programs.each_model if learner.per_slot else learner.fns.step
        return step(state, x, y, active, learn)

    def fn(buffers, x, y, active, learn):
        state = layout.unpack(buffers)
        xs, ys = (x[None], y[None]) if squeeze else (x, y)
        state, out, loss, applied = core(state, xs, ys, active, learn)
        return layout.pack(state), learner.programs.pack_out(out[0] if squeeze else out, loss, applied)
    options = learner.programs.options(learner.n, loop=False)
    x, y, a = learner.programs.example_inputs(None)
    return learner.programs.packed(fn, (x, y, a, a), options, donate="alone" if learner.donate else None)


def sides(hidden, algo, slots, shared):
    import streamtrace as st
    busy_one, slots = slots is not None and slots < 0, None if slots is None else abs(slots)
    rng = np.random.default_rng(0)
    out = {}
    for side in ("now", "before"):
        learner = st.OnlineLearner(st.nn.Stack("gru", N_IN, hidden, N_OUT), np.zeros(N_IN, np.float32),
                                   algorithm=algo, slots=None if slots is None else st.Slots(slots, shared=shared))
        prog = learner.programs.step() if side == "now" else before(learner)
        lead = () if slots is None else (slots,)
        x = rng.normal(size=lead + (N_IN,)).astype(np.float32)
        y = rng.normal(size=lead + (N_OUT,)).astype(np.float32)
        a = np.ones(learner.n, bool)
        if busy_one:
            a[1:] = False

        def step(learner=learner, prog=prog, x=x, y=y, a=a):
            learner.buffers, vec = prog(learner.buffers, x, y, a, a)
            return np.asarray(vec)
        out[side] = step
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pin-cpu", type=int, default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--round-s", type=float, default=0.3)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    import jax
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from paired import paired, ratio
    lines = [f"one-step program, deterministic (now) vs before, paired ({args.rounds} rounds), "
             f"{os.cpu_count()} vCPU, jax {jax.__version__}, "
             f"{'pinned' if args.pin_cpu is not None else 'unpinned'}", "",
             "| step | now µs | before µs | now / before |", "|---|---:|---:|---:|"]
    for label, hidden, algo, slots, shared in CASES:
        print(label, file=sys.stderr, flush=True)
        med = paired(sides(hidden, algo, slots, shared), args.rounds, args.round_s)
        lines.append(f"| {label} | {np.median(med['now']):.1f} | {np.median(med['before']):.1f} | "
                     f"{ratio(med, 'now', 'before'):.3f} |")
    print("\n".join(lines))
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
