"""Which readout should Stack("lif" | "alif" | "leaky") use? Measured, not argued.

Prequential one-step forecast of Mackey-Glass (tau = 17, scaled to [-1, 1], 6000 steps,
predict-then-learn with OnlineLearner(mode="forecast")); NRMSE = RMSE / std of the target
over the last 1000 steps; median over 3 seeds; persistence (predict x_t for x_{t+1}) as the
baseline. ``--standardise`` feeds the z-scored signal instead (NRMSE is unchanged by an
affine rescaling, so the numbers compare directly).

    python bench/readout_choice.py [--standardise] [--out results.jsonl]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import numpy as np
import optax

import streamtrace as st
from streamtrace.evaluation import tasks

STEPS, LAST = 6000, 1000


def mackey_glass(n):
    # the one generator the quality benchmark and `streamtrace evaluate` use
    return tasks.mackey_glass(n).astype(np.float32)


def nrmse(pred, target):
    return float(np.sqrt(np.mean((pred - target) ** 2)) / np.std(target))


def run(signal, kind, readout, lr, gain, n_hidden, seed, tau=None, bias=None, chunk=500):
    model = st.nn.Stack(kind, n_in=1, n_hidden=n_hidden, n_out=1, readout=readout, gain=gain, tau=tau,
                        bias_spread=bias or 0.0, seed=seed)
    learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast", optimizer=optax.adam(lr))
    preds = []
    for t0 in range(0, len(signal), chunk):
        preds += [r.prediction[0] for r in learner.step_many(signal[t0:t0 + chunk, None])]
    preds = np.asarray(preds)                       # preds[t] forecasts signal[t + 1]
    p, y = preds[-LAST - 1:-1], signal[-LAST:]
    return nrmse(p, y) if np.all(np.isfinite(p)) else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--standardise", action="store_true")
    ap.add_argument("--kinds", default="lif,alif,leaky")
    ap.add_argument("--readouts", default="linear,leaky")
    ap.add_argument("--lrs", default="1e-3,3e-3,1e-2")
    ap.add_argument("--gains", default="1,3")
    ap.add_argument("--sizes", default="64")
    ap.add_argument("--bias", type=float, default=None)
    ap.add_argument("--taus", default="default", help="neuron time constants ('default': the neuron's own)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    sig = mackey_glass(STEPS)
    if a.standardise:
        sig = ((sig - sig.mean()) / sig.std()).astype(np.float32)
    print(f"persistence NRMSE {nrmse(sig[-LAST - 1:-1], sig[-LAST:]):.3f}", file=sys.stderr)
    out = sys.stdout if a.out == "-" else open(a.out, "a")
    grid = itertools.product(a.kinds.split(","), a.readouts.split(","), map(float, a.lrs.split(",")),
                             map(float, a.gains.split(",")), map(int, a.sizes.split(",")),
                             [None if t == "default" else tuple(map(float, t.split(":"))) if ":" in t else float(t)
                              for t in a.taus.split(",")])
    for kind, readout, lr, gain, size, tau in grid:
        t = time.time()
        scores = [run(sig, kind, readout, lr, gain, size, int(s), tau, a.bias) for s in a.seeds.split(",")]
        row = dict(kind=kind, readout=readout, lr=lr, gain=gain, n_hidden=size, tau=tau, bias=a.bias, standardise=a.standardise,
                   nrmse=scores, median=float(np.median(scores)), seconds=round(time.time() - t, 1))
        print(json.dumps(row), file=out, flush=True)


if __name__ == "__main__":
    main()
