"""Neuron groups without weights of their own: LIF, ALIF, leaky rate units, and the
leaky rate readout. Feed them through a ``Linear`` (or a recurrent weight) to learn.

Spiking layers apply the reset of step t-1's spike at the start of step t, so the spike they
output is a function of the *new* state only: the learning signal dL/dh then reaches every
path to the output (the compiler checks this for any model).
"""
from __future__ import annotations

import math

import brainstate
import jax.numpy as jnp
import numpy as np

from . import ops
from ._init import key_or_new, uniform, zeros_state
from .surrogate import spike

__all__ = ["LIF", "ALIF", "LeakyRate", "LeakyRateReadout"]


def _decay(tau, size: int | None = None):
    """exp(-1/tau): a float, or one value per neuron when tau is a sequence of ``size`` values
    (a spread of time constants gives a group memory at several time scales)."""
    if np.ndim(tau) == 0:
        if not tau > 0:
            raise ValueError(f"time constant must be positive; got tau={tau}")
        return math.exp(-1.0 / float(tau))
    tau = np.asarray(tau, dtype=np.float64)
    if tau.ndim != 1 or (size is not None and tau.shape[0] != size):
        raise ValueError(f"per-neuron time constants must have shape ({size},); got {tau.shape}")
    if not np.all(tau > 0):
        raise ValueError(f"time constants must be positive; got min {tau.min()}")
    return np.exp(-1.0 / tau).astype(jnp.result_type(float))


class LIF(brainstate.nn.Module):
    """Leaky integrate-and-fire: ``V = a V - v_th s_{t-1} + I``, output ``s = H(V - v_th)``."""

    def __init__(self, size: int, tau: float = 10.0, v_th: float = 1.0):
        super().__init__()
        self.size = size
        self.alpha, self.v_th = _decay(tau, size), v_th

    def init_state(self, batch_size=None, **kwargs):
        self.V = zeros_state(self.size, batch_size)

    def update(self, current):
        v = self.V.value
        v = v - self.v_th * spike(v - self.v_th)  # soft reset of the previous spike
        v = self.alpha * v + current
        self.V.value = v
        return spike(v - self.v_th)


class ALIF(brainstate.nn.Module):
    """Adaptive LIF (two states per neuron): threshold ``v_th + beta * b``, ``b`` decays with ``tau_a``."""

    def __init__(self, size: int, tau: float = 10.0, tau_a: float = 100.0, v_th: float = 1.0, beta: float = 0.5):
        super().__init__()
        self.size = size
        self.alpha, self.rho = _decay(tau, size), _decay(tau_a, size)
        self.v_th, self.beta = v_th, beta

    def init_state(self, batch_size=None, **kwargs):
        self.V = zeros_state(self.size, batch_size)
        self.b = zeros_state(self.size, batch_size)

    def update(self, current):
        v, b = self.V.value, self.b.value
        s = spike(v - self.v_th - self.beta * b)
        v = self.alpha * (v - self.v_th * s) + current
        b = self.rho * b + s
        self.V.value, self.b.value = v, b
        return spike(v - self.v_th - self.beta * b)


class LeakyRate(brainstate.nn.Module):
    """Leaky rate unit: ``v = a v + (1 - a) I``, output ``tanh(v)``."""

    def __init__(self, size: int, tau: float = 5.0):
        super().__init__()
        self.size = size
        self.alpha = _decay(tau, size)

    def init_state(self, batch_size=None, **kwargs):
        self.v = zeros_state(self.size, batch_size)

    def update(self, current):
        self.v.value = self.alpha * self.v.value + (1.0 - self.alpha) * current
        return jnp.tanh(self.v.value)


class LeakyRateReadout(brainstate.nn.Module):
    """Leaky readout ``r = a r + (1 - a) (x @ W + b)``: its weight drives a hidden state, so it
    carries an eligibility trace (unlike a plain Linear readout, which is instant)."""

    def __init__(self, in_size: int, out_size: int, tau: float = 5.0, *, key=None):
        super().__init__()
        self.size = out_size
        self.alpha = _decay(tau)
        self.W = brainstate.ParamState(uniform(key_or_new(key), (in_size, out_size), in_size))
        self.b = brainstate.ParamState(jnp.zeros(out_size))

    def init_state(self, batch_size=None, **kwargs):
        self.r = zeros_state(self.size, batch_size)

    def update(self, x):
        y = ops.matmul(x, self.W.value, self.b.value)
        self.r.value = self.alpha * self.r.value + (1.0 - self.alpha) * y
        return self.r.value
