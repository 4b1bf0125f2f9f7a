"""Rolling prequential metrics per slot, in the user's units: exponentially weighted averages
with time constant ``window`` steps (bias-corrected, so the first steps are not pulled to 0)
of the squared and absolute error and of the target's first two moments, per channel.

    mse = mean_c se_c    mae = mean_c ae_c    nrmse = sqrt(sum_c se_c / sum_c var_c)

O(channels) state per slot; a step that was not scored, or whose squared error or target
overflowed, leaves a slot's averages unchanged.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from streamtrace_runner.rolling import summary

__all__ = ["RollingMetrics"]


class RollingMetrics:
    def __init__(self, window: int = 1000):
        if not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"metrics window must be an integer >= 1; got {window!r}")
        self.window = int(window)

    def init(self, n: int, n_out: int, dtype=jnp.float32) -> dict:
        z = jnp.zeros((n, n_out), dtype)
        return {"se": z, "ae": z, "y": z, "y2": z, "n": jnp.zeros(n, jnp.int32)}

    def update(self, state, pred, target, scored):
        a = 1.0 / self.window
        n = pred.shape[0]
        dt = state["se"].dtype
        e = (pred.reshape(n, -1) - target.reshape(n, -1)).astype(dt)
        y = target.reshape(n, -1).astype(dt)
        new = {"se": e * e, "ae": jnp.abs(e), "y": y, "y2": y * y}
        # a score that overflowed (an absurd value the screen did not catch) is not averaged in:
        # it would stay in the averages for good
        scored = scored & jnp.isfinite(jnp.sum(new["se"] + new["y2"], axis=-1))
        s = scored[:, None]
        out = {k: jnp.where(s, (1 - a) * state[k] + a * v, state[k]) for k, v in new.items()}
        out["n"] = state["n"] + scored.astype(jnp.int32)
        return out

    def summary(self, state: dict) -> dict:
        """Host numpy state -> per-slot ``{"mse", "mae", "nrmse", "n"}`` (NaN before any score;
        ``streamtrace_runner.rolling.summary``, which the jax-free runner uses too)."""
        return summary(state, self.window)
