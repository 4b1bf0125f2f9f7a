"""Same answers: an exported learner's runner against the jax learner built from the same
config, over Mackey-Glass steps, in one process (the issue's accuracy targets):

    python bench/export_accuracy.py [--steps 10000] [--target host]

For each model (the default learner, float64; GRU-16 and spiking LIF-16, float32; LSTM-16,
float64): the largest and the median relative difference of the one-step predictions after
the first 100 (the default learner's normaliser warm-up; relative to each prediction, so large
where a prediction crosses zero), the largest difference relative to the predictions' RMS, and
the NRMSE of both over the last half of the steps (their relative difference).
"""
from __future__ import annotations

import argparse
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODELS = {"default (float64)": None,
          "GRU-16 (float32)": '[model]\nstack = "gru"\nn_hidden = 16\n',
          "LIF-16 (float32)": '[model]\nstack = "lif"\nn_hidden = 16\n',
          "LSTM-16 (float64)": '[model]\nstack = "lstm"\nn_hidden = 16\nprecision = 64\n'}
SKIP = 100


def _nrmse(pred, target):
    return math.sqrt(np.mean((pred - target) ** 2)) / np.std(target)


def one(name, text, steps, target, work) -> dict:
    from streamtrace.evaluation.tasks import mackey_glass
    from streamtrace.export.learner import learner_from_config
    from streamtrace.export.runner import Runner
    from streamtrace.export.write import export_learner
    config = None
    if text:
        config = Path(work) / f"{len(text)}.toml"
        config.write_text(text)
    folder = Path(work) / name.split()[0]
    export_learner(config, folder, target)
    learner, runner = learner_from_config(config)[1], Runner(folder)
    xs = mackey_glass(steps + 1)
    ref, got = np.empty(steps), np.empty(steps)
    for t in range(steps):
        x = np.full((1,) + learner.x_shape, xs[t], learner.x_dtype)
        ref[t] = np.asarray(learner.step(x).prediction).ravel()[0]
        got[t] = runner.step(x)[0].ravel()[0]
    diff = np.abs(got - ref)[SKIP:]
    rel = diff / np.maximum(np.abs(ref[SKIP:]), 1e-12)
    half = steps // 2
    n_ref, n_got = _nrmse(ref[half:], xs[half + 1:steps + 1]), _nrmse(got[half:], xs[half + 1:steps + 1])
    return {"max": rel.max(), "median": float(np.median(rel)), "scaled": diff.max() / np.sqrt(np.mean(ref ** 2)),
            "nrmse_jax": n_ref, "nrmse_runner": n_got,
            "nrmse_rel": abs(n_got - n_ref) / n_ref}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--target", default="host")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="acc-")
    print(f"runner vs jax learner, {a.steps} Mackey-Glass steps, target {a.target}, "
          f"{platform.processor() or platform.machine()}\n\n| model | max relative | median relative | NRMSE jax "
          "| NRMSE runner | NRMSE rel. diff | max diff / RMS |\n|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for name, text in MODELS.items():
        t = time.perf_counter()
        r = one(name, text, a.steps, a.target, work)
        print(f"| {name} | {r['max']:.2g} | {r['median']:.2g} | {r['nrmse_jax']:.6g} | {r['nrmse_runner']:.6g} | "
              f"{r['nrmse_rel']:.1g} | {r['scaled']:.2g} |  ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
