"""Command line: ``streamtrace demo | serve | bench``."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo_local(args) -> int:
    """Learn a generated signal online, one step per sample, and show the loss falling."""
    import time

    import numpy as np
    import optax

    from .learner import OnlineLearner
    from .nn import Stack

    rng = np.random.default_rng(args.seed)
    t = np.arange(args.steps)
    signal = (np.sin(0.07 * t) + 0.5 * np.sin(0.023 * t + 1.0) + 0.05 * rng.normal(size=t.size)).astype(np.float32)
    learner = OnlineLearner(Stack(args.model, 1, args.hidden, 1), np.zeros(1, np.float32), mode="forecast",
                            algorithm=args.algorithm, optimizer=optax.adam(args.lr))
    print(f"streamtrace demo: {args.model.upper()}-{args.hidden}, {args.algorithm}, forecasting a noisy "
          f"two-tone signal one step ahead, {args.steps} steps, one update per step")
    window, losses, t0 = max(1, args.steps // 10), [], time.perf_counter()
    for i in range(args.steps):
        losses.append(learner.step(signal[i:i + 1]).loss[0])
        if (i + 1) % window == 0:
            recent = np.nanmean(losses[-window:])
            print(f"  step {i + 1:6d}   one-step-ahead MSE {recent:.5f}")
    elapsed = time.perf_counter() - t0
    first, last = np.nanmean(losses[1:window + 1]), np.nanmean(losses[-window:])
    print(f"loss fell {first / last:.1f}x ({first:.4f} -> {last:.5f}); "
          f"{elapsed / args.steps * 1e6:.0f} us per step including compile; stats: {learner.stats()}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="streamtrace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="online learning demo on a generated signal")
    demo.add_argument("--model", default="gru", help="built-in stack: gru, lstm, rnn, lif, alif, leaky")
    demo.add_argument("--hidden", type=int, default=32)
    demo.add_argument("--algorithm", default="d-rtrl", choices=["d-rtrl", "es-d-rtrl", "rtrl"])
    demo.add_argument("--lr", type=float, default=1e-3)
    demo.add_argument("--steps", type=int, default=4000)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo_local)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
