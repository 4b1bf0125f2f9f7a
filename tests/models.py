"""Small test models built from streamtrace.nn layers."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from streamtrace import nn
from streamtrace.etrace.model_fn import ModelFunction


class Stack(brainstate.nn.Module):
    """input Linear -> neuron group -> Linear readout (element-wise recurrent models)."""

    def __init__(self, neuron, n_in=3, n_hidden=5, n_out=2, gain=3.0, seed=0):
        super().__init__()
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        self.inp = nn.Linear(n_in, n_hidden, key=k1)
        self.cell = neuron(n_hidden)
        self.out = nn.Linear(n_hidden, n_out, key=k2)
        self.gain = gain

    def update(self, x):
        return self.out(self.cell(self.inp(x) * self.gain))


class CellNet(brainstate.nn.Module):
    """recurrent cell (taking the input itself) -> Linear readout."""

    def __init__(self, cell, n_in=3, n_hidden=5, n_out=2, seed=0):
        super().__init__()
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        self.cell = cell(n_in, n_hidden, key=k1)
        self.out = nn.Linear(n_hidden, n_out, key=k2)

    def update(self, x):
        return self.out(self.cell(x))


def make(model, batch=2):
    brainstate.nn.init_all_states(model, batch)
    return model


def lif_net(**kw):
    return make(Stack(lambda n: nn.LIF(n, tau=5.0), **kw))


def alif_net(**kw):
    return make(Stack(lambda n: nn.ALIF(n, tau=5.0, tau_a=20.0, beta=0.3), **kw))


def rate_net(**kw):
    """leaky rate units -> Linear readout."""
    return make(Stack(lambda n: nn.LeakyRate(n, tau=4.0), gain=1.0, **kw))


def two_layer_rate_net(**kw):
    """leaky rate units with a leaky rate readout (every weight carries a trace)."""
    class RateNet(brainstate.nn.Module):
        def __init__(self, n_in=3, n_hidden=5, n_out=2, seed=0):
            super().__init__()
            k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
            self.inp = nn.Linear(n_in, n_hidden, key=k1)
            self.cell = nn.LeakyRate(n_hidden, tau=4.0)
            self.out = nn.LeakyRateReadout(n_hidden, n_out, tau=3.0, key=k2)

        def update(self, x):
            return self.out(self.cell(self.inp(x)))
    return make(RateNet(**kw))


def diag_rnn_net(**kw):
    return make(CellNet(nn.DiagRNNCell, **kw))


def gru_net(**kw):
    return make(CellNet(nn.GRUCell, **kw))


def lstm_net(**kw):
    return make(CellNet(nn.LSTMCell, **kw))


def rnn_net(**kw):
    return make(CellNet(nn.RNNCell, **kw))


def bptt_grads(model, params, hidden, xs, ys, t, loss):
    """Oracle: jax.grad of L_t through the whole unrolled history 0..t (weights frozen),
    calling model.update directly (no jaxpr analysis, no traces)."""
    f = ModelFunction(model)

    def L(p):
        h = hidden
        for i in range(t + 1):
            out, h = f(p, h, xs[i])
        return loss(out, ys[t])
    return jax.grad(L)(params)


def mse(out, y):
    return jnp.sum((out - y) ** 2)


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-300))


class Chained(brainstate.nn.Module):
    """Two states per neuron with a chain inside the step (u_t reads v_t), element-wise."""

    def __init__(self, size):
        super().__init__()
        self.size = size

    def init_state(self, batch_size=None, **kwargs):
        shape = (self.size,) if batch_size is None else (batch_size, self.size)
        self.v = brainstate.HiddenState(jnp.zeros(shape))
        self.u = brainstate.HiddenState(jnp.zeros(shape))

    def update(self, current):
        v = 0.8 * self.v.value + current
        u = 0.6 * self.u.value + jnp.tanh(v) * 0.7
        self.v.value, self.u.value = v, u
        return u


def online_grads(algo, xs, ys):
    """The online gradient at every step: ``algo`` run over ``xs`` with jax.grad of the MSE to
    ``ys`` through one step at a time (the traces carry the history). Returns (params, grads)."""
    params, hidden, traces = algo.init_state()

    def loss(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return mse(out, y), (h, tr)

    step = jax.jit(jax.grad(loss, has_aux=True))
    grads = []
    for t in range(len(xs)):
        g, (hidden, traces) = step(params, hidden, traces, xs[t], ys[t])
        grads.append(g)
    return params, grads


def chained_net(**kw):
    return make(Stack(Chained, gain=1.0, **kw))


def online_rows(algo, params, xs, ys):
    """Per step, with weights frozen: the online gradient of sum((out - y)^2), the output,
    the new hidden state and the new traces, as NumPy."""
    _, hidden, traces = algo.init_state()

    def loss(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return jnp.sum((out - y) ** 2), (out, h, tr)

    step = jax.jit(jax.grad(loss, has_aux=True))
    to_np = lambda tree: jax.tree_util.tree_map(np.asarray, tree)
    rows = []
    for t in range(len(xs)):
        g, (out, hidden, traces) = step(params, hidden, traces, jnp.asarray(xs[t]), jnp.asarray(ys[t]))
        rows.append(dict(grads=to_np(g), out=np.asarray(out), hidden=to_np(hidden), traces=to_np(traces)))
    return rows


# --- custom derivative rules in the step (compiler hardening) --------------------------------------

@jax.custom_jvp
def unit_norm(v):
    """Normalise each row: mixes the neurons of a row (a custom_jvp with the true derivative)."""
    return v / jnp.sqrt(jnp.sum(v ** 2, axis=-1, keepdims=True) + 1.0)


@unit_norm.defjvp
def _unit_norm_jvp(primals, tangents):
    f = lambda v: v / jnp.sqrt(jnp.sum(v ** 2, axis=-1, keepdims=True) + 1.0)
    return jax.jvp(f, primals, tangents)


@jax.custom_jvp
def soft_clip(v):
    """Element-wise, with a hand-written derivative."""
    return 2.0 * jnp.tanh(0.5 * v)


@soft_clip.defjvp
def _soft_clip_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return soft_clip(v), (1.0 - jnp.tanh(0.5 * v) ** 2) * dv


@jax.custom_vjp
def vjp_spike(v):
    """Heaviside spike with a fast-sigmoid surrogate, written with custom_vjp as many libraries do."""
    return (v > 0).astype(v.dtype)


def _vjp_spike_fwd(v):
    return vjp_spike(v), v


def _vjp_spike_bwd(v, g):
    return (g / (1.0 + 4.0 * jnp.abs(v)) ** 2,)


vjp_spike.defvjp(_vjp_spike_fwd, _vjp_spike_bwd)


class CustomLeaky(brainstate.nn.Module):
    """Leaky unit whose recurrence passes through ``fn`` (a custom_jvp / custom_vjp function)."""

    def __init__(self, size, fn, tau=4.0):
        super().__init__()
        self.size, self.fn, self.alpha = size, fn, float(np.exp(-1.0 / tau))

    def init_state(self, batch_size=None, **kwargs):
        shape = (self.size,) if batch_size is None else (batch_size, self.size)
        self.v = brainstate.HiddenState(jnp.zeros(shape))

    def update(self, current):
        self.v.value = self.fn(self.alpha * self.v.value + (1.0 - self.alpha) * current)
        return jnp.tanh(self.v.value)


class VjpLIF(brainstate.nn.Module):
    """Our LIF, with the spike written as a custom_vjp."""

    def __init__(self, size, tau=5.0, v_th=1.0):
        super().__init__()
        self.size, self.alpha, self.v_th = size, float(np.exp(-1.0 / tau)), v_th

    def init_state(self, batch_size=None, **kwargs):
        shape = (self.size,) if batch_size is None else (batch_size, self.size)
        self.V = brainstate.HiddenState(jnp.zeros(shape))

    def update(self, current):
        v = self.V.value
        v = self.alpha * (v - self.v_th * vjp_spike(v - self.v_th)) + current
        self.V.value = v
        return vjp_spike(v - self.v_th)


def custom_leaky_net(fn, **kw):
    return make(Stack(lambda n: CustomLeaky(n, fn), gain=1.0, **kw))


def vjp_lif_net(**kw):
    return make(Stack(VjpLIF, **kw))


# --- weights written without streamtrace.nn.ops ---------------------------------------------------

class BrainstateLinearNet(brainstate.nn.Module):
    """brainstate.nn.Linear input -> one of our neuron groups -> brainstate.nn.Linear readout."""

    def __init__(self, neuron, n_in=3, n_hidden=5, n_out=2, gain=3.0):
        super().__init__()
        self.inp = brainstate.nn.Linear(n_in, n_hidden)
        w = self.inp.weight.value   # a non-zero bias, so its gradient is tested too
        self.inp.weight.value = dict(w, bias=0.1 * jax.random.normal(jax.random.PRNGKey(7), w["bias"].shape))
        self.cell = neuron(n_hidden)
        self.out = brainstate.nn.Linear(n_hidden, n_out)
        self.gain = gain

    def update(self, x):
        return self.out(self.cell(self.inp(x) * self.gain))


class PlainGainNet(brainstate.nn.Module):
    """Plain jax: per-neuron input gain ``x * g`` and a plain ``x @ W + b``, no marked ops."""

    def __init__(self, n_in=3, n_hidden=5, n_out=2, seed=0):
        super().__init__()
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
        self.W = brainstate.ParamState(jax.random.normal(k1, (n_in, n_hidden)) / np.sqrt(n_in))
        self.b = brainstate.ParamState(jnp.zeros(n_hidden))
        self.g = brainstate.ParamState(1.0 + 0.2 * jax.random.normal(k2, (n_hidden,)))
        self.cell = nn.LeakyRate(n_hidden, tau=4.0)
        self.R = brainstate.ParamState(jax.random.normal(k3, (n_hidden, n_out)) / np.sqrt(n_hidden))

    def update(self, x):
        h = self.cell((x @ self.W.value + self.b.value) * self.g.value)
        return h @ self.R.value


class JitVjpLIF(VjpLIF):
    """VjpLIF with its state update inside a nested jax.jit (a custom_vjp inside a call)."""

    def update(self, current):
        v = jax.jit(lambda v, c: self.alpha * (v - self.v_th * vjp_spike(v - self.v_th)) + c)(self.V.value, current)
        self.V.value = v
        return vjp_spike(v - self.v_th)
