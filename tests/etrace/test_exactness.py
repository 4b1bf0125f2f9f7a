"""Online gradients against BPTT (jax.grad through the unrolled history), float64.

D-RTRL is exact when every recurrence is element-wise; exact RTRL is exact for any model.
"""
import jax
import jax.numpy as jnp
import pytest

import streamtrace as st

from models import (alif_net, bptt_grads, chained_net, diag_rnn_net, gru_net, lif_net, lstm_net, mse, online_grads,
                    rate_net, rel_err)

T = 50


def data(model_in=3, model_out=2, batch=2, steps=T, seed=1):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return (jax.random.normal(kx, (steps, batch, model_in)),
            jax.random.normal(ky, (steps, batch, model_out)))


@pytest.mark.parametrize("make", [lif_net, alif_net, rate_net, diag_rnn_net, chained_net],
                         ids=["lif", "alif", "leaky-rate", "diag-rnn", "chained-states"])
def test_d_rtrl_equals_bptt_at_every_step_on_elementwise_models(x64, make):
    model = make()
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, xs[0])
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    # the oracle is costly (t+1 unrolled steps per t): check a spread of steps, incl. the last
    worst = 0.0
    for t in (0, 1, 7, 23, T - 1):
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        assert any(float(jnp.abs(oracle[n]).max()) > 1e-3 for n in algo.graph.trace_params), \
            "oracle gradient vanished: the test would not see an error"
        for n in params:
            worst = max(worst, rel_err(grads[t][n], oracle[n]))
    assert worst <= 1e-6, worst


def test_d_rtrl_every_step_lif(x64):
    """All 50 steps, not a sample, on the LIF stack."""
    model = lif_net()
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, xs[0])
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    f = st.etrace.model_fn.ModelFunction(model)

    # one unrolled pass yields every L_t's gradient via a per-t mask on the loss
    def L(p, t):
        h, loss = hidden, 0.0
        for i in range(T):
            out, h = f(p, h, xs[i])
            loss = loss + jnp.where(i == t, mse(out, ys[i]), 0.0)
        return loss
    # LLVM's optimisation of this 50-step unrolled oracle takes > 20 min under jax 0.12 (half a minute
    # under 0.10); the oracle runs once, so it is compiled unoptimised (same arithmetic, no fast-math)
    oracle = jax.jit(jax.vmap(jax.grad(L), in_axes=(None, 0)),
                     compiler_options={"xla_backend_optimization_level": 0})(params, jnp.arange(T))
    for t in range(T):
        for n in params:
            assert rel_err(grads[t][n], oracle[n][t]) <= 1e-6, (t, n)


@pytest.mark.parametrize("make", [gru_net, lstm_net], ids=["gru", "lstm"])
def test_exact_rtrl_equals_bptt_on_dense_recurrence(x64, make):
    model = make()
    xs, ys = data()
    algo = st.etrace.RTRL(model, xs[0])
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    for t in (0, 3, 17, T - 1):
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        for n in params:
            assert rel_err(grads[t][n], oracle[n]) <= 1e-6, (t, n)
