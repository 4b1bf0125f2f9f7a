"""Multi-step VJP: exact BPTT inside a window plus the trace term from before it."""
import jax
import jax.numpy as jnp
import pytest

import streamtrace as st
from streamtrace.etrace.model_fn import ModelFunction

from models import alif_net, gru_net, mse, rel_err

T0, K = 12, 6


def _data(seed=5):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(kx, (T0 + K, 2, 3)) * 2.0, jax.random.normal(ky, (T0 + K, 2, 2))


def _prefix(algo, xs):
    params, h, tr = algo.init_state()
    step = jax.jit(algo.forward)
    for t in range(T0):
        _, h, tr = step(params, h, tr, (xs[t],))
    return params, h, tr


def _window_grad(algo, params, h, tr, xs, ys, *extra):
    def L(p):
        outs, _, _ = algo(p, h, tr, st.etrace.MultiStepData(xs[T0:]), *extra)
        return jnp.sum((outs - ys[T0:]) ** 2)
    return jax.jit(jax.grad(L))(params)


def _full_history_grad(model, params, h0, xs, ys):
    """Oracle: BPTT of the window's loss through the whole history from step 0."""
    f = ModelFunction(model)

    def full(p):
        hh, loss = h0, 0.0
        for t in range(T0 + K):
            out, hh = f(p, hh, xs[t])
            if t >= T0:
                loss = loss + mse(out, ys[t])
        return loss
    return jax.grad(full)(params)


def test_multistep_equals_window_bptt_plus_trace_term_on_gru(x64):
    model = gru_net()
    xs, ys = _data()
    algo = st.etrace.D_RTRL(model, xs[0], vjp_method="multi-step")
    params, h, tr = _prefix(algo, xs)
    got = _window_grad(algo, params, h, tr, xs, ys)
    f = ModelFunction(model)

    def window_loss(p, h0):
        loss = 0.0
        for t in range(T0, T0 + K):
            out, h0 = f(p, h0, xs[t])
            loss = loss + mse(out, ys[t])
        return loss
    # oracle part 1: BPTT inside the window with the window's start state held fixed
    g_in, dh0 = jax.grad(window_loss, argnums=(0, 1))(params, h)
    # oracle part 2: dL/dh_{t0} contracted with the D-RTRL traces at the window start
    for n in params:
        want = g_in[n]
        key = f"eps.{n}"
        if key in tr:
            want = want + jnp.einsum("bo,bio->io" if tr[key].ndim == 4 else "bo,bo->o",
                                     dh0["cell.h"], tr[key][..., 0])
        assert rel_err(got[n], want) <= 1e-9, n
    # the trace term matters here: without it the gradient differs
    assert rel_err(g_in["cell.z.W"], got["cell.z.W"]) > 1e-6


def test_multistep_rtrl_equals_full_bptt_on_gru(x64):
    """With exact traces the window gradient is the full-history BPTT gradient."""
    model = gru_net()
    xs, ys = _data()
    algo = st.etrace.RTRL(model, xs[0], vjp_method="multi-step")
    params, h, tr = _prefix(algo, xs)
    got = _window_grad(algo, params, h, tr, xs, ys)
    want = _full_history_grad(model, params, algo.graph.init_hidden(), xs, ys)
    for n in params:
        assert rel_err(got[n], want[n]) <= 1e-9, n


@pytest.mark.parametrize("method", ["single-step", "multi-step"])
def test_window_on_elementwise_model_equals_full_bptt(x64, method):
    """ALIF is element-wise: both VJP methods over a window give the full BPTT gradient
    (single-step over a window: the reference library refuses this input)."""
    model = alif_net()
    xs, ys = _data()
    algo = st.etrace.D_RTRL(model, xs[0], vjp_method=method)
    params, h, tr = _prefix(algo, xs)
    got = _window_grad(algo, params, h, tr, xs, ys)
    want = _full_history_grad(model, params, algo.graph.init_hidden(), xs, ys)
    for n in params:
        assert rel_err(got[n], want[n]) <= 1e-9, n


def test_single_step_over_window_sums_per_step_online_gradients(x64):
    model = gru_net()
    xs, ys = _data()
    algo = st.etrace.D_RTRL(model, xs[0])
    params, h, tr = _prefix(algo, xs)
    got = _window_grad(algo, params, h, tr, xs, ys)

    def one(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return mse(out, y), (h, tr)
    step = jax.jit(jax.grad(one, has_aux=True))
    acc = {n: 0.0 for n in params}
    for t in range(T0, T0 + K):
        g, (h, tr) = step(params, h, tr, xs[t], ys[t])
        acc = {n: acc[n] + g[n] for n in params}
    for n in params:
        assert rel_err(got[n], acc[n]) <= 1e-9, n


def test_single_step_data_is_broadcast_to_every_step(x64):
    """A SingleStepData argument is fed unchanged at each step of the window."""
    import brainstate
    from streamtrace import nn

    class TwoInputs(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(3, 4, key=jax.random.PRNGKey(0))
            self.cell = nn.LIF(4)
            self.out = nn.Linear(4, 2, key=jax.random.PRNGKey(1))

        def update(self, x, bias):
            return self.out(self.cell(self.inp(x) * 2.0 + bias))
    model = TwoInputs()
    brainstate.nn.init_all_states(model, 2)
    xs, _ = _data()
    bias = jnp.full((2, 4), 0.3)
    algo = st.etrace.D_RTRL(model, xs[0], bias)
    params, h, tr = algo.init_state()
    outs, h_w, _ = algo(params, h, tr, st.etrace.MultiStepData(xs[:4]), st.etrace.SingleStepData(bias))
    step_h = h
    for t in range(4):
        out, step_h, tr = algo(params, step_h, tr, xs[t], bias)
        assert jnp.allclose(outs[t], out)
    assert jnp.allclose(h_w["cell.V"], step_h["cell.V"])
    with pytest.raises(ValueError, match="window length"):
        algo(params, h, tr, st.etrace.MultiStepData(xs[:4]), st.etrace.MultiStepData(jnp.zeros((3, 2, 4))))
