"""Outlier screening: a glitching sensor's absurd but finite value is caught before anything
learns from it.

Every input channel of every slot keeps a running location and a running mean absolute
deviation (exponentially weighted, time constant ``1 / rate`` steps; over the first samples a
plain mean). A value further from the location than ``threshold`` deviations, or outside the
channel's hard ``range``, is an outlier. With ``policy="skip"`` the step sees instead the value
the learner forecast for it (forecast mode; else the channel's last good value), the slot learns
nothing from the step and the step is not scored (the
rolling metrics and the prequential loss skip it); with ``policy="clip"`` the value is clipped
to the limit and learnt from. Either way the step's result says so and the slot's count grows.

A real change of level is not a glitch for long: while a channel keeps being an outlier its
limit widens by ``growth`` each step, and the first value accepted beyond the plain limit moves
the location there at once. A level ``k`` times the limit away is accepted after about
``log(k) / log(growth)`` steps (growth 1.5: 100 deviations at the 3rd step, 1e6 only at the
25th), so a burst of glitches stays screened while a new operating point is learnt from soon.
Values out of the hard range are never accepted. In supervised mode the targets that come
with their x are screened the same way (statistics of their own, no hard range): a glitched
target is not learnt from. NaN and infinite values are left to the step's
own guard (the slot skips the step and it is counted as ``skipped``).

A screen is given as the first of the learner's transforms (``transform=chain(screen(),
normalise(), residual())``): as a transform it leaves the numbers as they are; the learner finds
it there and wraps its step functions in ``Screened``, whose state gains a ``screen`` entry per
slot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .transforms import Transform, _Chain

__all__ = ["Screen", "screen", "Screened", "POLICIES", "screen_in"]

POLICIES = ("skip", "clip")


@dataclass(frozen=True)
class Screen(Transform):
    """How a stream's channels are screened for outliers (see ``screen``)."""
    name = "screen"
    policy: str = "skip"
    threshold: float = 30.0
    rate: float = 0.01
    growth: float = 1.5
    warmup: int = 4
    ranges: tuple | None = None

    def bind(self, channels) -> "Screen":
        return self       # it screens every input channel, whatever a forecast predicts

    def describe(self) -> dict:
        return {"kind": "screen", "policy": self.policy, "threshold": self.threshold, "rate": self.rate, "growth": self.growth,
                "warmup": self.warmup, "ranges": None if self.ranges is None else [list(r) for r in self.ranges]}

    # ---- state ------------------------------------------------------------------------
    # one array per slot and channel, (N, C, 5): accepted count (capped), outliers in a row,
    # location, mean absolute deviation, last accepted value; one array keeps the screen's
    # work to a couple of fused loops inside the step
    def init(self, n: int, channels: int, dtype) -> jax.Array:
        return jnp.zeros((n, channels, 5), dtype)

    def _bounds(self, channels: int, dtype):
        if self.ranges is None:
            return None
        r = np.asarray(self.ranges, np.float64).reshape(-1, 2)
        if r.shape[0] == 1:
            r = np.repeat(r, channels, axis=0)
        if r.shape[0] != channels:
            raise ValueError(f"screen: {r.shape[0]} ranges for {channels} input channels")
        return jnp.asarray(r[:, 0], dtype), jnp.asarray(r[:, 1], dtype)

    def _limit(self, n, run, loc, dev):
        """The plain limit (threshold deviations, never below a sliver of the level) and the
        widened one of a channel that has been an outlier ``run`` steps in a row."""
        base = self.threshold * jnp.maximum(dev, 1e-9 * (jnp.abs(loc) + 1e-9))
        return base, base * jnp.power(jnp.asarray(self.growth, base.dtype), run)

    # ---- one step ----------------------------------------------------------------------
    def check(self, s, x):
        """(flag, clean): which finite values of x (N, C) are outliers, and the values the step
        sees instead (the last good one, or clipped)."""
        n, run, loc, dev, last = (s[..., i] for i in range(5))
        base, wide = self._limit(n, run, loc, dev)
        finite = jnp.isfinite(x)
        robust = finite & (n >= self.warmup) & (jnp.abs(x - loc) > wide)
        flag = robust
        bounds = self._bounds(x.shape[-1], x.dtype)
        if bounds is not None:
            lo, hi = bounds
            flag = flag | (finite & ((x < lo) | (x > hi)))
        if self.policy == "clip":
            clean = jnp.where(robust, jnp.clip(x, loc - base, loc + base), x)
            if bounds is not None:
                clean = jnp.where(finite, jnp.clip(clean, lo, hi), clean)
        else:
            fallback = x if bounds is None else jnp.clip(x, lo, hi)   # nothing good seen yet
            clean = jnp.where(flag, jnp.where(n > 0, last, fallback), x)
        return flag, clean

    def observe(self, s, x, flag, ok):
        """Learn each channel's location and deviation from the accepted values of x (N, C);
        ``ok`` (N,): the slots whose x was looked at. Returns the new state."""
        x = x.astype(s.dtype)
        n, run, loc, dev, last = (s[..., i] for i in range(5))
        base, _ = self._limit(n, run, loc, dev)
        seen = ok[:, None] & jnp.isfinite(x)
        take = seen & ~flag if self.policy == "skip" else seen
        d = jnp.abs(x - loc)
        a = jnp.maximum(1.0 / (n + 1), self.rate)
        jump = (run > 0) & (d > base) & (n >= self.warmup)     # a new level, accepted
        new = jnp.stack([jnp.minimum(n + 1, 1e6), jnp.zeros_like(run),
                         jnp.where(jump, x, loc + a * (x - loc)),
                         jnp.where(n == 0, 0.0, jnp.where(jump, jnp.maximum(dev, d / self.threshold),
                                                           dev + a * (d - dev))), x], axis=-1)
        out = jnp.where(take[..., None], new, s)
        out = out.at[..., 1].set(jnp.where(seen & flag, run + 1, out[..., 1]))
        return out.astype(s.dtype)


def screen(policy: str = "skip", *, threshold: float = 30.0, rate: float = 0.01, growth: float = 1.5,
           warmup: int = 4, ranges=None) -> Screen:
    """Outlier screening of a learner's input channels, the first of its transforms.

    Every channel keeps a running location and mean absolute deviation; a value too far from
    them (or outside the hard ``ranges``) is an outlier, counted in ``stats()["outliers"]`` and
    ``StepResult.outlier``. Use it for sensors that glitch: an absurd value is then neither
    learnt from nor scored. ``OnlineLearner(..., transform=chain(screen(), normalise(),
    residual()))``.

    Parameters
    ----------
    policy : {"skip", "clip"}, default "skip"
        "skip": an outlier is replaced by the learner's forecast of it (or the channel's last
        good value), and the slot neither learns from nor is scored on that step. "clip": it is
        clipped to the limit, and learnt from.
    threshold : float, default 30.0
        How many running mean absolute deviations from the running location a value may be
        (30: no false alarm on the quality benchmark's series, measured).
    rate : float, default 0.01
        The running statistics' rate (time constant ``1 / rate`` steps).
    growth : float, default 1.5
        How fast a channel's limit widens while it keeps being an outlier (> 1).
    warmup : int, default 4
        Samples a channel takes as they come before it is screened (hard ranges apply from the
        first).
    ranges : tuple or list of tuples, optional
        Hard limits in the stream's units: ``(lo, hi)`` for every channel or one pair per
        channel; a value outside is always an outlier.

    Returns
    -------
    Screen

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
    ...                            transform=st.chain(st.screen(), st.normalise()))
    >>> for t in range(20):
    ...     r = learner.step(np.array([np.sin(0.3 * t)], np.float32))
    >>> bool(learner.step(np.array([1e6], np.float32)).outlier), learner.stats()["outliers"]
    (True, 1)
    """
    if policy not in POLICIES:
        raise ValueError(f"screen: policy must be one of {POLICIES}; got {policy!r}")
    for name, v, lo in (("threshold", threshold, 0.0), ("rate", rate, 0.0), ("growth", growth, 1.0)):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= lo:
            raise ValueError(f"screen: {name} must be a finite number > {lo:g}; got {v!r}")
    if rate > 1:
        raise ValueError(f"screen: rate must be <= 1; got {rate!r}")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"screen: warmup must be an integer >= 1; got {warmup!r}")
    if ranges is not None:
        r = np.asarray(ranges, np.float64)
        if r.ndim == 1:
            r = r[None]
        if r.ndim != 2 or r.shape[1] != 2 or not np.all(r[:, 0] < r[:, 1]):
            raise ValueError(f"screen: ranges must be (lo, hi) with lo < hi, or one such pair per channel; "
                             f"got {ranges!r}")
        ranges = tuple(tuple(float(v) for v in p) for p in r)
    return Screen(policy, float(threshold), float(rate), float(growth), int(warmup), ranges)


def screen_in(transform) -> tuple:
    """(screen, the other transforms): the screen among a learner's transforms (it must come
    first: it screens the stream's own numbers) or None, and the transforms without it."""
    if isinstance(transform, Screen):
        return transform, None
    parts = transform.parts if isinstance(transform, _Chain) else ()
    found = [i for i, p in enumerate(parts) if isinstance(p, Screen)]
    if not found:
        return None, transform
    if found != [0]:
        raise ValueError("screen() must come first in chain(...): it screens the stream's own numbers")
    rest = parts[1:]
    return parts[0], (rest[0] if len(rest) == 1 else _Chain(rest))


def _held(keep, new, old):
    """``old`` where ``keep`` (N,), else ``new``, on leaves with a leading slot axis."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(keep.reshape(keep.shape + (1,) * (a.ndim - 1)), b, a),
                                  new, old)


class Screened:
    """A learner's step functions with their input screened first (``Screen``). With the skip
    policy an outlier is replaced by the learner's own forecast of it in forecast mode (where
    one was made), else by the channel's last good value. Everything but ``init`` and ``step``
    is the wrapped functions'."""

    def __init__(self, inner, screen: Screen):
        self.inner, self.screen = inner, screen

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _targets(self) -> bool:
        """Supervised targets that come with their x are screened too (delayed labels are not)."""
        cfg = self.inner.cfg
        return cfg.mode == "supervised" and not cfg.label_delay

    def init(self, n_slots, x_shape, x_dtype, **kw) -> dict:
        state = self.inner.init(n_slots, x_shape, x_dtype, **kw)
        # the counts as float32 (exact to 2**24 per slot): two more int32 leaves in the packed
        # int32 buffer had XLA write it in 9 pieces, 13 kernels where 6 do (measured:
        # bench/glitch_cost.py, the default 1.2x -> 1.02x)
        z = jnp.zeros(n_slots, jnp.float32)
        sc = {"x": self.screen.init(n_slots, math.prod(x_shape), jnp.dtype(x_dtype)), "count": z, "now": z}
        if self._targets():
            sc["y"] = self.screen.init(n_slots, math.prod(kw["y_shape"]), jnp.dtype(kw.get("y_dtype") or x_dtype))
        return {**state, "screen": sc}

    def _forecast(self, state, flat, held):
        """Forecast mode: the values the learner forecast for this step (in the forecast
        channels, where a forecast was made), else ``held`` (the last good values): a glitch
        inside a smooth signal is bridged by the model's own forecast, not a flat line."""
        pend = state["pending"]
        pred = pend["pred"].reshape(flat.shape[0], -1).astype(flat.dtype)
        channels = self.inner.cfg.channels
        if channels is None:
            if pred.shape != flat.shape:
                return held
            guess = pred
        else:
            guess = held.at[:, jnp.asarray(channels)].set(pred)
        made = (pend["valid"] > 0)[:, None] & jnp.isfinite(guess)
        return jnp.where(made, guess, held)

    def step(self, state, x, target, active, learn):
        s, n, screen = state["screen"], x.shape[0], self.screen
        skip = screen.policy == "skip"
        flat = x.reshape(n, -1)
        flag, clean = screen.check(s["x"], flat)
        if skip and "pending" in state:
            clean = jnp.where(flag, self._forecast(state, flat, clean), clean)
        bad = jnp.any(flag, axis=-1)
        seen = active & jnp.all(jnp.isfinite(flat), axis=-1)
        new_s = {"x": screen.observe(s["x"], flat if skip else clean, flag, seen)}
        if "y" in s:      # a glitched target: the slot does not learn from it
            t = target.reshape(n, -1)
            looked = seen & learn & jnp.all(jnp.isfinite(t), axis=-1)
            t_flag, t_clean = screen.check(s["y"], t)
            t_flag = t_flag & looked[:, None]
            new_s["y"] = screen.observe(s["y"], t if skip else t_clean, t_flag, looked)
            target = target if skip else t_clean.reshape(target.shape).astype(target.dtype)
            bad = bad | jnp.any(t_flag, axis=-1)
        learn = learn & ~bad if skip else learn
        new, out, loss, applied = self.inner.step(state, clean.reshape(x.shape).astype(x.dtype), target,
                                                  active, learn)
        if skip:    # the step of an outlier is not scored: its error says nothing of the model
            kept = {k: state["stats"][k] for k in ("preq_sum", "preq_n", "roll")}
            now = {k: new["stats"][k] for k in kept}
            new = {**new, "stats": {**new["stats"], **_held(bad & active, now, kept)}}
            loss = jnp.where(bad, jnp.nan, loss)
        now = (seen & bad).astype(jnp.float32)
        return {**new, "screen": {**new_s, "count": s["count"] + now, "now": now}}, out, loss, applied
