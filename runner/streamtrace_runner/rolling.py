"""The learner's rolling prequential metrics as users read them (``serve``'s and the runner's
``stats``): its state (``stats.roll.*``: exponentially weighted averages of the squared and
absolute error and of the target's first two moments, per slot and channel) summarised in
numpy, without jax."""
from __future__ import annotations

import numpy as np

__all__ = ["summary"]


def summary(state: dict, window: int) -> dict:
    """Per-slot ``{"mse", "mae", "nrmse", "n"}`` (NaN before any score) of the rolling state
    ``{"se", "ae", "y", "y2": (slots, channels), "n": (slots,)}`` with time constant ``window``
    steps (bias-corrected).

    >>> s = {"se": np.array([[0.5]]), "ae": np.array([[0.5]]), "y": np.array([[0.0]]),
    ...      "y2": np.array([[0.5]]), "n": np.array([1])}
    >>> {k: float(v[0]) for k, v in summary(s, 2).items()}
    {'mse': 1.0, 'mae': 1.0, 'nrmse': 1.0, 'n': 1.0}
    """
    n = np.asarray(state["n"])
    corr = 1.0 - (1.0 - 1.0 / window) ** n
    with np.errstate(invalid="ignore", divide="ignore"):
        m = {k: np.asarray(state[k]) / corr[:, None] for k in ("se", "ae", "y", "y2")}
        var = np.maximum(m["y2"] - m["y"] ** 2, 0.0)
        out = {"mse": m["se"].mean(1), "mae": m["ae"].mean(1),
               "nrmse": np.sqrt(m["se"].sum(1) / var.sum(1))}
    for k in ("mse", "mae", "nrmse"):
        out[k] = np.where(n > 0, out[k], np.nan)
    out["n"] = n.astype(np.int64)
    return out
