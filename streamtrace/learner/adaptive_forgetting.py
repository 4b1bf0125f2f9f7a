"""Forget faster after a detected change: variable forgetting for an RLS readout.

An RLS readout with forgetting 1 remembers every sample it saw; after its stream changes
regime (Mackey-Glass whose delay goes from 17 to 30), the old samples in its inverse covariance
P outweigh the new ones for thousands of steps. Constant forgetting tracks but costs steady
state accuracy and winds P up along directions the features stop exciting. Here forgetting
is switched on only when a change detector fires, for a limited number of steps.

Detector, per slot, on x_t = the squared prior (prequential) error of the readout that predicts
(the lowest recent error; mean over outputs):

    x_t  <- min(x_t, cap * slow)            one outlier cannot fire it (cap = 10)
    fast <- fast + a_f (x_t - fast)         a_f = max(1/n, 1/fast_window)
    slow <- slow + a_s (x_t - slow)         a_s = max(1/n, 1/slow_window)
    fire  = n > slow_window and fast > threshold * slow and left == 0
    left  = hold if fire else max(left - 1, 0)

While ``left > 0`` the step forgets with ``lam_change``: P is divided by it after the RLS
update, so the next update is exactly an RLS step with forgetting lam * lam_change (rls.py: k
and P' of forgetting lam are those of P / lam with none). While nothing fires the factor is 1.0
and the readout is bit for bit the plain one. The detector state lives in the readout's state (``readout.forget.*``), so
checkpoints and resume carry it.

Why these values (docs/quality.md, regime-switch): a fast window of 50 and the cap keep the
single error bursts of ``multichannel`` (fast/slow up to 2.5) below the threshold 3.5, while
the switch gives ~5; forgetting 0.99 for 1,000 steps then takes the default's error after the
switch from 3.5e-3 to 1.1e-3; 0.98 overshot (one seed in three worse).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .barriers import hold

__all__ = ["ChangeDetector", "AdaptiveForgetting", "adaptive_forgetting", "CAP", "SettingError"]

CAP = 10.0      # a squared error counts at most CAP times the slow level


class SettingError(ValueError):
    """A bad setting: ``key`` is its config name (``change_lam``...), ``problem`` what is wrong."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


class ChangeDetector:
    """Pure init/update pair: ``update(state, x, ok) -> (state, forgetting)`` per slot. A bad
    setting raises ``SettingError`` naming its ``[readout]`` config key (``change_*``)."""

    def __init__(self, lam_change: float = 0.99, *, threshold: float = 3.5, hold: int = 1000,
                 fast: int = 50, slow: int = 500):
        def need(ok, name, what, v):
            if not ok:
                raise SettingError(name, f"must be {what}; got {v!r}")
        num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        integer = lambda v: isinstance(v, int) and not isinstance(v, bool)       # noqa: E731
        need(num(lam_change) and 0 < lam_change <= 1, "change_lam", "in (0, 1] (1: off)", lam_change)
        need(num(threshold) and 1 < threshold < float("inf"), "change_threshold",
             "a finite number > 1 (fast error / slow error)", threshold)
        need(integer(hold) and hold >= 1, "change_hold", "an integer >= 1 (steps)", hold)
        need(integer(fast) and fast >= 1, "change_fast", "an integer >= 1 (steps)", fast)
        need(integer(slow) and slow > (fast if integer(fast) else 0), "change_slow",
             "an integer > change_fast (steps)", slow)
        self.lam_change, self.threshold = float(lam_change), float(threshold)
        self.hold, self.fast, self.slow = hold, fast, slow

    def describe(self) -> dict:
        return {"lam_change": self.lam_change, "threshold": self.threshold, "hold": self.hold,
                "fast": self.fast, "slow": self.slow}

    def init(self, n: int, dtype) -> dict:
        z = jnp.zeros((n,), dtype)
        return {"n": z, "fast": z, "slow": z, "left": z, "fired": z}

    def update(self, s, x, ok):
        """x (N,) squared prior errors, ok (N,) where they count: (state, forgetting (N,))."""
        good = ok & jnp.isfinite(x)
        x = jnp.where(s["n"] > 0, jnp.minimum(x, CAP * s["slow"]), x)
        n1 = s["n"] + 1
        fast = s["fast"] + jnp.maximum(1.0 / n1, 1.0 / self.fast) * (x - s["fast"])
        slow = s["slow"] + jnp.maximum(1.0 / n1, 1.0 / self.slow) * (x - s["slow"])
        fire = good & (n1 > self.slow) & (fast > self.threshold * slow) & (s["left"] == 0)
        left = jnp.where(fire, float(self.hold), jnp.maximum(s["left"] - 1, 0.0))
        keep = lambda new, old: jnp.where(good, new, old)      # noqa: E731
        new = {"n": keep(n1, s["n"]), "fast": keep(fast, s["fast"]), "slow": keep(slow, s["slow"]),
               "left": keep(left, s["left"]), "fired": s["fired"] + fire}
        forgetting = jnp.where(good & (new["left"] > 0), self.lam_change, 1.0).astype(x.dtype)
        return new, forgetting


class AdaptiveForgetting:
    """An RLS readout (``rls.RLSReadout``) whose P is divided by the detector's forgetting
    after each update (so the next update forgets with it). Features and predictions are the
    inner readout's; its state is the inner one's plus ``forget`` (the detector's)."""

    def __init__(self, inner, detector: ChangeDetector):
        self.inner, self.detector = inner, detector
        self.n_out = inner.n_out

    def describe(self) -> dict:
        return {**self.inner.describe(), "change": self.detector.describe()}

    def n_features(self, n_feat: int, n_in: int) -> int:
        return self.inner.n_features(n_feat, n_in)

    def init(self, n, n_feat, n_in, n_out, dtype) -> dict:
        return {**self.inner.init(n, n_feat, n_in, n_out, dtype), "forget": self.detector.init(n, dtype)}

    def features(self, h, x):
        return self.inner.features(h, x)

    def predict(self, state, r):
        return self.inner.predict(state, r)

    def update(self, state, r, y, ok):
        inner = {k: v for k, v in state.items() if k != "forget"}
        W = inner["W"]
        e = y.reshape(y.shape[0], 1, -1).astype(W.dtype) - self.inner._all(W, r.astype(W.dtype))
        e2 = jnp.mean(e * e, axis=-1)                                              # (N, k)
        best = jnp.argmin(inner["err"], axis=1)         # the readout predict() uses
        x = jnp.take_along_axis(e2, best[:, None], axis=1)[:, 0]
        forget, lam = self.detector.update(state["forget"], x, ok)
        out, e = self.inner.update(inner, r, y, ok)
        # after the update, not before: P then enters the update's products untouched, and a
        # stream that never fires is bit for bit the plain readout (measured: dividing first
        # changed XLA's fusion and the predictions by ~1e-9)
        # the factor computed apart from P's update: fused into it, IREE (streamtrace export)
        # evaluated the factor's conditions again for every vector of P; XLA's results the same
        lam = hold(lam)
        out["P"] = out["P"] / lam[:, None, None, None]
        return {**out, "forget": forget}, e


def adaptive_forgetting(inner, lam_change: float = 0.99, *, threshold: float = 3.5, hold: int = 1000,
                        fast: int = 50, slow: int = 500):
    """``inner`` (an ``rls`` readout) forgetting with ``lam_change`` for ``hold`` steps after
    its error's ``fast``-step average exceeds ``threshold`` times its ``slow``-step one."""
    return AdaptiveForgetting(inner, ChangeDetector(lam_change, threshold=threshold, hold=hold,
                                                    fast=fast, slow=slow))
