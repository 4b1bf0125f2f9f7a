"""Rate layers: Linear and the recurrent cells (vanilla, diagonal, GRU, LSTM).

Every weight acts through a marked op (``ops.matmul`` / ``ops.elementwise``) so the
eligibility-trace compiler can find it; recurrent variables are ``HiddenState``s created by
``init_state(batch_size)`` (call ``brainstate.nn.init_all_states(model, batch_size)``).
"""
from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp

from . import ops
from ._init import key_or_new, uniform, zeros_state

__all__ = ["Linear", "RNNCell", "DiagRNNCell", "GRUCell", "LSTMCell"]


class Linear(brainstate.nn.Module):
    """``y = x @ W + b``. With no hidden state downstream it is an instant (readout) weight."""

    def __init__(self, in_size: int, out_size: int, bias: bool = True, *, key=None):
        super().__init__()
        self.W = brainstate.ParamState(uniform(key_or_new(key), (in_size, out_size), in_size))
        self.b = brainstate.ParamState(jnp.zeros(out_size)) if bias else None

    def update(self, x):
        return ops.matmul(x, self.W.value, None if self.b is None else self.b.value)


class _Gate(brainstate.nn.Module):
    """One gate of a cell: a weight on [x, h] (+ bias)."""

    def __init__(self, in_size, out_size, key, bias_init=0.0):
        super().__init__()
        self.W = brainstate.ParamState(uniform(key, (in_size, out_size), in_size))
        self.b = brainstate.ParamState(jnp.full(out_size, bias_init, jnp.result_type(float)))

    def update(self, xh):
        return ops.matmul(xh, self.W.value, self.b.value)


class RNNCell(brainstate.nn.Module):
    """Vanilla (Elman) cell: ``h = tanh([x, h] @ W + b)``; dense recurrence."""

    def __init__(self, in_size: int, hidden_size: int, *, key=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.cell = _Gate(in_size + hidden_size, hidden_size, key_or_new(key))

    def init_state(self, batch_size=None, **kwargs):
        self.h = zeros_state(self.hidden_size, batch_size)

    def update(self, x):
        self.h.value = jnp.tanh(self.cell(jnp.concatenate([x, self.h.value], axis=-1)))
        return self.h.value


class DiagRNNCell(brainstate.nn.Module):
    """Diagonal RNN: ``h = tanh(x @ W + b + w_rec * h)``; each neuron only sees itself."""

    def __init__(self, in_size: int, hidden_size: int, *, key=None):
        super().__init__()
        k1, k2 = jax.random.split(key_or_new(key))
        self.hidden_size = hidden_size
        self.inp = _Gate(in_size, hidden_size, k1)
        self.w_rec = brainstate.ParamState(jax.random.uniform(k2, (hidden_size,), minval=0.3, maxval=0.9))

    def init_state(self, batch_size=None, **kwargs):
        self.h = zeros_state(self.hidden_size, batch_size)

    def update(self, x):
        self.h.value = jnp.tanh(self.inp(x) + ops.elementwise(self.h.value, self.w_rec.value))
        return self.h.value


class GRUCell(brainstate.nn.Module):
    """GRU: z, r gates and candidate n, each its own marked weight on [x, h] / [x, r*h]."""

    def __init__(self, in_size: int, hidden_size: int, *, key=None):
        super().__init__()
        kz, kr, kn = jax.random.split(key_or_new(key), 3)
        self.hidden_size = hidden_size
        n = in_size + hidden_size
        self.z = _Gate(n, hidden_size, kz)
        self.r = _Gate(n, hidden_size, kr)
        self.n = _Gate(n, hidden_size, kn)

    def init_state(self, batch_size=None, **kwargs):
        self.h = zeros_state(self.hidden_size, batch_size)

    def update(self, x):
        h = self.h.value
        xh = jnp.concatenate([x, h], axis=-1)
        z = jax.nn.sigmoid(self.z(xh))
        r = jax.nn.sigmoid(self.r(xh))
        n = jnp.tanh(self.n(jnp.concatenate([x, r * h], axis=-1)))
        self.h.value = (1.0 - z) * h + z * n
        return self.h.value


class LSTMCell(brainstate.nn.Module):
    """LSTM with states c and h (one hidden group, two states per neuron)."""

    def __init__(self, in_size: int, hidden_size: int, *, key=None):
        super().__init__()
        ki, kf, kg, ko = jax.random.split(key_or_new(key), 4)
        self.hidden_size = hidden_size
        n = in_size + hidden_size
        self.i = _Gate(n, hidden_size, ki)
        self.f = _Gate(n, hidden_size, kf, bias_init=1.0)
        self.g = _Gate(n, hidden_size, kg)
        self.o = _Gate(n, hidden_size, ko)

    def init_state(self, batch_size=None, **kwargs):
        self.c = zeros_state(self.hidden_size, batch_size)
        self.h = zeros_state(self.hidden_size, batch_size)

    def update(self, x):
        xh = jnp.concatenate([x, self.h.value], axis=-1)
        i = jax.nn.sigmoid(self.i(xh))
        f = jax.nn.sigmoid(self.f(xh))
        g = jnp.tanh(self.g(xh))
        o = jax.nn.sigmoid(self.o(xh))
        c = f * self.c.value + i * g
        self.c.value = c
        self.h.value = o * jnp.tanh(c)
        return self.h.value
