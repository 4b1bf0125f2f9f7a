"""The compiler accepts only what it can differentiate correctly (issue 8, items 10-13).

Oracles: BPTT by jax.grad through the unrolled model (model.update called directly, the
user's own custom rules included), float64.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st
from streamtrace.etrace.errors import CompileError

from models import (bptt_grads, custom_leaky_net, mse, rel_err, soft_clip, unit_norm, vjp_lif_net)

T = 30


def data(n_in=3, n_out=2, batch=2, steps=T, seed=1, scale=1.0):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return (scale * jax.random.normal(kx, (steps, batch, n_in)), jax.random.normal(ky, (steps, batch, n_out)))


def online_grads(algo, xs, ys):
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


def worst_vs_bptt(model, algo, xs, ys, steps=(0, 3, 11, T - 1)):
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    worst = 0.0
    for t in steps:
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        assert any(float(jnp.abs(oracle[n]).max()) > 1e-3 for n in algo.graph.trace_params), \
            "oracle gradient vanished: the test would not see an error"
        for n in params:
            worst = max(worst, rel_err(grads[t][n], oracle[n]))
    return worst


# --- item 10: custom_jvp -------------------------------------------------------------------------

def test_custom_jvp_that_mixes_neurons_is_refused_by_name(x64):
    model = custom_leaky_net(unit_norm)
    xs, _ = data()
    with pytest.raises(CompileError, match="unit_norm"):
        st.compile_graph(model, xs[0])


def test_elementwise_custom_jvp_in_the_recurrence_matches_bptt(x64):
    model = custom_leaky_net(soft_clip)
    xs, ys = data()
    algo = st.D_RTRL(model, xs[0])
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


# --- item 11: custom_vjp -------------------------------------------------------------------------

def test_custom_vjp_surrogate_lif_matches_bptt(x64):
    """A LIF whose spike is a custom_vjp learns with D-RTRL; BPTT goes through the same
    custom_vjp (its bwd) by jax.grad."""
    model = vjp_lif_net()
    xs, ys = data(scale=2.0)
    algo = st.D_RTRL(model, xs[0])
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


def test_custom_vjp_that_mixes_neurons_is_refused_by_name(x64):
    @jax.custom_vjp
    def pool(v):
        return v - jnp.mean(v, axis=-1, keepdims=True)
    pool.defvjp(lambda v: (pool(v), None), lambda _, g: (g - jnp.mean(g, axis=-1, keepdims=True),))
    model = custom_leaky_net(pool)
    xs, _ = data()
    with pytest.raises(CompileError, match="pool"):
        st.compile_graph(model, xs[0])
