"""``streamtrace learn``: the engine-free online learning demo (one process, the loss printed as
it falls)."""
from __future__ import annotations

import math

from .demo import two_tone
from .loss_fall import finite_mean, first_last, number_or_dash

__all__ = ["run_cli"]


def run_cli(args) -> int:
    import numpy as np

    from ..learner import OnlineLearner, adam
    from ..learner.dispatch import inline_dispatch
    from ..nn import Stack

    inline_dispatch()       # each step is awaited at once (learner/dispatch.py)
    series = two_tone(0, args.steps + 1)
    learner = OnlineLearner(Stack(args.model, 1, args.hidden, 1), np.zeros(1, np.float32), mode="forecast",
                            algorithm=args.algorithm, optimizer=adam(args.lr))
    print(f"online learning: {args.model.upper()}-{args.hidden}, {args.algorithm}, forecasting a two-tone signal")
    every, losses = max(1, args.steps // 10), []     # a line per tenth of the run
    for i in range(args.steps):
        losses.append(learner.step(series[i:i + 1]).loss[0])
        if (i + 1) % every == 0:
            print(f"  step {i + 1:6d}   one-step-ahead MSE {number_or_dash(finite_mean(losses[-every:]), '.5f')}",
                  flush=True)
    first, last = first_last(losses[1:], every)
    if not (math.isfinite(first) and last > 0):
        print("too few steps with a loss to say how it fell")
        return 0
    print(f"loss fell {first / last:.1f}x ({first:.4f} -> {last:.5f})")
    return 0
