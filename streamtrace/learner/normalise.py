"""Online per-channel standardisation, causal: the statistics used for a sample are those of
the samples before it. Running mean and variance (Welford) over the first ``warmup`` samples,
then either frozen (``rate=0``) or tracking slowly as an exponential average with ``rate``.
The learner does not learn from a slot until its warm-up is over: what a readout or the
weights learn in units that are still moving would be wrong once they settle.

Inputs and supervised targets each get their own statistics; a forecast's target is the next
input, so its statistics are those of the forecast channels.
"""
from __future__ import annotations

import jax.numpy as jnp

from .transforms import Transform

__all__ = ["Normalise", "normalise"]


class Normalise(Transform):
    name = "normalise"

    def __init__(self, warmup: int = 100, rate: float = 0.0, eps: float = 1e-8):
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"normalise: warmup must be an integer >= 1; got {warmup!r}")
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"normalise: rate must be in [0, 1); got {rate}")
        if not eps > 0:
            raise ValueError(f"normalise: eps must be > 0; got {eps}")
        self.warmup, self.rate, self.eps = warmup, float(rate), float(eps)

    def describe(self):
        return {"kind": self.name, "warmup": self.warmup, "rate": self.rate, "eps": self.eps}

    def init(self, n, x_shape, y_shape):
        st = lambda shape: {"mean": jnp.zeros((n,) + tuple(shape), jnp.float32),
                            "var": jnp.ones((n,) + tuple(shape), jnp.float32)}
        state = {"n": jnp.zeros(n, jnp.float32), "x": st(x_shape)}
        if self.channels is None:
            state["y"] = st(y_shape)
        return state

    def _stats(self, state, which):
        if which == "y" and self.channels is not None:
            s = state["x"]
            return s["mean"][..., self.channels], s["var"][..., self.channels]
        return state[which]["mean"], state[which]["var"]

    def _scale(self, var, n):
        # until two samples have been seen the scale is 1 (no information yet)
        n = n.reshape(n.shape + (1,) * (var.ndim - 1))
        return jnp.where(n >= 2, jnp.sqrt(var + self.eps), 1.0)

    def encode(self, state, x):
        mean, var = self._stats(state, "x")
        return ((x - mean) / self._scale(var, state["n"])).astype(x.dtype)

    def target(self, state, x, y):
        mean, var = self._stats(state, "y")
        return ((y - mean) / self._scale(var, state["n"])).astype(y.dtype)

    def decode(self, state, x, y):
        mean, var = self._stats(state, "y")
        return (y * self._scale(var, state["n"]) + mean).astype(y.dtype)

    def _update(self, s, v, n, ok):
        lead = lambda a: a.reshape(a.shape + (1,) * (v.ndim - 1))
        n1 = n + 1
        # Welford during warm-up (weight 1/n), then an exponential average (rate 0: frozen);
        # one formula for both: var' = (1 - w) var + w d (v - mean')
        w = lead(jnp.where(n1 <= self.warmup, 1.0 / n1, self.rate))
        v = v.astype(jnp.float32)
        d = v - s["mean"]
        mean = s["mean"] + w * d
        var = (1.0 - w) * s["var"] + w * d * (v - mean)
        okl = lead(ok)
        return {"mean": jnp.where(okl, mean, s["mean"]), "var": jnp.where(okl, var, s["var"])}

    def ready(self, state):
        return state["n"] >= self.warmup

    def observe(self, state, x, y, ok):
        new = {"n": jnp.where(ok, state["n"] + 1, state["n"]), "x": self._update(state["x"], x, state["n"], ok)}
        if "y" in state:
            new["y"] = state["y"] if y is None else self._update(state["y"], y, state["n"], ok)
        return new


def normalise(warmup: int = 100, rate: float = 0.0, eps: float = 1e-8) -> Normalise:
    """Causal per-channel standardisation of inputs and targets.

    The statistics used for a sample are those of the samples before it: a running mean and
    variance (Welford) over the first ``warmup`` samples, then frozen (``rate=0``) or tracked as
    an exponential average. The model then sees values of about unit scale whatever the
    sensor's units, and predictions are mapped back to them. The learner does not learn from a
    slot until its warm-up is over.

    Parameters
    ----------
    warmup : int, default 100
        Samples (steps) whose mean and variance are taken before learning starts.
    rate : float, default 0.0
        After the warm-up: 0 freezes the statistics, a value in (0, 1) tracks them with time
        constant ``1 / rate`` steps.
    eps : float, default 1e-8
        Added to the variance (a constant channel is not divided by zero).

    Returns
    -------
    Normalise

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
    ...                            transform=st.normalise(warmup=5))
    >>> for t in range(8):
    ...     r = learner.step(np.array([1000.0 + 10 * np.sin(t)], np.float32))
    >>> learner.stats()["updates"] > 0, bool(abs(r.prediction[0] - 1000) < 50)   # in the sensor's units
    (True, True)
    """
    return Normalise(warmup, rate, eps)
