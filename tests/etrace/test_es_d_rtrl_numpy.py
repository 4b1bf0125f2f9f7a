"""ES-D-RTRL (pp-prop) on a one-layer LIF against its formulas written out in NumPy, float64.

The NumPy oracle below re-implements the LIF step, its surrogate derivative, the
input/output-dimension traces and the gradient contraction without streamtrace or jax; only
the initial weight values are read from ``params``. It is compared at every step of a run.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import online_rows

import streamtrace as st
from streamtrace import nn

B, I, H = 3, 4, 6
T = 40
TAU, V_TH = 5.0, 1.0


class OneLayerLIF(brainstate.nn.Module):
    """x -> Linear(I, H) -> LIF(H); the output is the spike vector."""

    def __init__(self, seed=0):
        super().__init__()
        self.inp = nn.Linear(I, H, key=jax.random.PRNGKey(seed))
        self.cell = nn.LIF(H, tau=TAU, v_th=V_TH)

    def update(self, x):
        return self.cell(self.inp(x))


def make_model(seed=0):
    model = OneLayerLIF(seed)
    brainstate.nn.init_all_states(model, B)
    return model


def make_data(seed=1, scale=1.5):
    rng = np.random.default_rng(seed)
    xs = rng.normal(0.3, 1.0, (T, B, I)) * scale          # positive mean: neurons reach threshold
    ys = (rng.uniform(size=(T, B, H)) < 0.3).astype(np.float64)  # binary spike targets
    return xs, ys


# ---- the NumPy oracle -----------------------------------------------------------------------
def np_heaviside(u):
    return (u > 0).astype(np.float64)


def np_sg(u):
    return 1.0 / (1.0 + 4.0 * np.abs(u)) ** 2


def numpy_es_d_rtrl(W, b, xs, ys, a):
    """Per step: V, spikes, xbar, fbar, xbar_bias, dW, db (all float64)."""
    alpha = np.exp(-1.0 / TAU)
    V = np.zeros((B, H))
    xbar = np.zeros((B, I))
    fbar = np.zeros((B, H))
    xbar_b = np.zeros(B)
    rows = []
    for t in range(len(xs)):
        x, y = xs[t], ys[t]
        V_prev = V
        v = V_prev - V_TH * np_heaviside(V_prev - V_TH)
        V = alpha * v + (x @ W + b)
        spike = np_heaviside(V - V_TH)
        D = alpha * (1.0 - V_TH * np_sg(V_prev - V_TH))
        F = np.ones((B, H))
        xbar = a * xbar + x
        fbar = a * D * fbar + (1.0 - a) * F
        xbar_b = a * xbar_b + 1.0
        g = 2.0 * (spike - y) * np_sg(V - V_TH)
        sig = g * fbar
        dW = xbar.T @ sig
        db = np.einsum("b,bo->o", xbar_b, sig)
        rows.append(dict(V=V, spike=spike, xbar=xbar, fbar=fbar, xbar_b=xbar_b, dW=dW, db=db))
    return rows


# ---- running the library --------------------------------------------------------------------
def close(actual, desired, rtol=1e-9):
    desired = np.asarray(desired)
    atol = rtol * max(float(np.max(np.abs(desired))), 1e-300)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)


@pytest.mark.parametrize("decay", [0.0, 0.6, 0.9])
def test_es_d_rtrl_matches_numpy_formulas_every_step(x64, decay):
    model = make_model()
    xs, ys = make_data()
    algo = st.etrace.ES_D_RTRL(model, jnp.asarray(xs[0]), decay=decay)
    params, _, traces0 = algo.init_state()
    assert params["inp.W"].dtype == jnp.float64
    assert set(traces0) == {"xbar.inp.W", "fbar.inp.W", "xbar.inp.b"}
    assert traces0["fbar.inp.W"].shape == (B, H, 1)
    # a non-zero bias, so the bias enters the dynamics too
    params = dict(params, **{"inp.b": jnp.asarray(np.linspace(-0.2, 0.3, H))})

    W, b = np.asarray(params["inp.W"], np.float64), np.asarray(params["inp.b"], np.float64)
    ref = numpy_es_d_rtrl(W, b, xs, ys, decay)
    got = online_rows(algo, params, xs, ys)

    spikes = np.stack([r["spike"] for r in ref])
    # the run must exercise spikes and resets, and the gradient must be non-trivial
    assert 0.05 < spikes.mean() < 0.8, spikes.mean()
    assert spikes[:-1].sum() > 10  # resets happen (a spike at t resets at t+1)
    assert np.mean([np.abs(r["dW"]).max() > 1e-3 for r in ref]) > 0.5

    for t in range(T):
        r, o = ref[t], got[t]
        np.testing.assert_array_equal(o["out"], r["spike"], err_msg=f"step {t}")
        close(o["hidden"]["cell.V"], r["V"])
        close(o["traces"]["xbar.inp.W"], r["xbar"])
        close(o["traces"]["fbar.inp.W"][..., 0], r["fbar"])
        close(o["traces"]["xbar.inp.b"], r["xbar_b"])
        try:
            close(o["grads"]["inp.W"], r["dW"])
            close(o["grads"]["inp.b"], r["db"])
        except AssertionError as e:
            raise AssertionError(f"gradient differs at step {t}") from e


def test_es_d_rtrl_decay_zero_is_instantaneous(x64):
    """a = 0: xbar = x_t, fbar = F_t = 1, so dW is the one-step (no-history) gradient."""
    model = make_model()
    xs, ys = make_data()
    algo = st.etrace.ES_D_RTRL(model, jnp.asarray(xs[0]), decay=0.0)
    params, _, _ = algo.init_state()
    got = online_rows(algo, params, xs[:10], ys[:10])
    for t in range(10):
        np.testing.assert_array_equal(got[t]["traces"]["xbar.inp.W"], xs[t])
        np.testing.assert_array_equal(got[t]["traces"]["fbar.inp.W"], np.ones((B, H, 1)))
        np.testing.assert_array_equal(got[t]["traces"]["xbar.inp.b"], np.ones(B))


def test_es_d_rtrl_differs_from_numpy_with_wrong_decay(x64):
    """Sanity of the oracle's sensitivity: a different decay gives a measurably different gradient."""
    model = make_model()
    xs, ys = make_data()
    algo = st.etrace.ES_D_RTRL(model, jnp.asarray(xs[0]), decay=0.6)
    params, _, _ = algo.init_state()
    W, b = np.asarray(params["inp.W"]), np.asarray(params["inp.b"])
    ref = numpy_es_d_rtrl(W, b, xs, ys, 0.5)
    got = online_rows(algo, params, xs, ys)
    worst = max(float(np.max(np.abs(got[t]["grads"]["inp.W"] - ref[t]["dW"]))) for t in range(T))
    assert worst > 1e-3


@pytest.mark.parametrize("rank", [1, 2, 3, 7.5])
def test_rank_gives_decay(rank):
    model = make_model()
    algo = st.etrace.ES_D_RTRL(model, jnp.ones((B, I)), rank=rank)
    assert algo.decay == pytest.approx((rank - 1.0) / (rank + 1.0), rel=1e-15, abs=0)
    assert 0.0 <= algo.decay < 1.0


def test_rank_one_is_decay_zero():
    model = make_model()
    algo = st.etrace.ES_D_RTRL(model, jnp.ones((B, I)), rank=1)
    assert algo.decay == 0.0


def test_pp_prop_alias():
    assert st.etrace.pp_prop is st.etrace.ES_D_RTRL


@pytest.mark.parametrize("kw", [dict(decay=1.0), dict(decay=-0.1), dict(decay=1.5),
                                dict(decay=0.5, rank=3), dict(), dict(rank=0.5), dict(rank=-2)],
                         ids=["decay=1", "decay=-0.1", "decay=1.5", "both", "neither", "rank<1", "rank<0"])
def test_invalid_decay_or_rank_raises(kw):
    model = make_model()
    with pytest.raises(ValueError):
        st.etrace.ES_D_RTRL(model, jnp.ones((B, I)), **kw)
