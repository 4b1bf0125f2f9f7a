"""Learning-signal hooks (RandomFeedback, KappaFilter, chains) against independent oracles, float64.

The oracles contract by hand (NumPy) the traces the algorithm carries with a learning signal
computed by hand from the step's output: dL/dout = 2 (out - y) for the squared error, and for
the LIF stack dL/dV_t = (dL/dout @ W_out^T) * sg(V_t - v_th).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import lif_net, make, online_rows

import streamtrace as st
from streamtrace import nn
from streamtrace.etrace.signals import LearningSignal, as_signal
from streamtrace.etrace.signals import SignalChain as Chain

T = 15
B_, N_IN, N_H, N_OUT = 2, 3, 5, 2
V_TH = 1.0  # lif_net's threshold (the LIF default)


def data(steps=T, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(0.2, 1.0, (steps, B_, N_IN)), rng.normal(0.0, 1.0, (steps, B_, N_OUT))


def sg(u):
    return 1.0 / (1.0 + 4.0 * np.abs(u)) ** 2


def close(actual, desired, rtol=1e-10):
    desired = np.asarray(desired)
    atol = rtol * max(float(np.max(np.abs(desired))), 1e-300)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)


def dl_dout(row, y):
    return 2.0 * (row["out"] - y)


def dl_dv(row, y, params):
    """dL_t/dV_t for the LIF stack (output = spike(V_t - v_th) @ W_out + b_out)."""
    V = row["hidden"]["cell.V"]
    return (dl_dout(row, y) @ np.asarray(params["out.W"]).T) * sg(V - V_TH)


def readout_grads(row, y):
    """Exact one-step gradient of the instant readout: spikes^T @ dL/dout."""
    spikes = (row["hidden"]["cell.V"] > V_TH).astype(np.float64)
    ct = dl_dout(row, y)
    return spikes.T @ ct, ct.sum(0)


def assert_spiking(rows):
    rate = np.mean([(r["hidden"]["cell.V"] > V_TH).mean() for r in rows])
    assert 0.05 < rate < 0.9, rate


# ---- (a) RandomFeedback ---------------------------------------------------------------------
def test_random_feedback_d_rtrl_matches_manual_contraction(x64):
    model = lif_net()
    xs, ys = data()
    hook = st.etrace.RandomFeedback(seed=3)
    algo = st.etrace.D_RTRL(model, jnp.asarray(xs[0]), signal=hook)
    plain = st.etrace.D_RTRL(model, jnp.asarray(xs[0]))
    params, _, _ = algo.init_state()

    bound = algo.signal   # bind() fits a copy of the hook to this algorithm
    assert hook.B is None and len(bound.B) == 1 and bound.B[0].shape == (1, N_OUT, N_H)
    Bm = np.asarray(bound.B[0])
    rows, ref = online_rows(algo, params, xs, ys), online_rows(plain, params, xs, ys)
    assert_spiking(rows)

    differs = 0.0
    for t in range(T):
        r, p = rows[t], ref[t]
        # the hook does not touch the forward pass or the traces
        np.testing.assert_array_equal(r["out"], p["out"])
        for n in p["traces"]:
            np.testing.assert_array_equal(r["traces"][n], p["traces"][n])
        g = np.einsum("bk,sko->bos", dl_dout(r, ys[t]), Bm)
        close(r["grads"]["inp.W"], np.einsum("bos,bios->io", g, r["traces"]["eps.inp.W"]))
        close(r["grads"]["inp.b"], np.einsum("bos,bos->o", g, r["traces"]["eps.inp.b"]))
        # the readout keeps its exact one-step gradient, hook or not
        dWo, dbo = readout_grads(r, ys[t])
        close(r["grads"]["out.W"], dWo)
        close(r["grads"]["out.b"], dbo)
        close(r["grads"]["out.W"], p["grads"]["out.W"])
        close(r["grads"]["out.b"], p["grads"]["out.b"])
        differs = max(differs, float(np.abs(r["grads"]["inp.W"] - p["grads"]["inp.W"]).max()))
    assert differs > 1e-3  # random feedback is not the true readout path
    assert max(np.abs(r["grads"]["inp.W"]).max() for r in rows) > 1e-3


def test_random_feedback_es_d_rtrl_matches_manual_contraction(x64):
    model = lif_net()
    xs, ys = data()
    hook = st.etrace.RandomFeedback(seed=4)
    algo = st.etrace.ES_D_RTRL(model, jnp.asarray(xs[0]), decay=0.5, signal=hook)
    params, _, _ = algo.init_state()
    Bm = np.asarray(algo.signal.B[0])
    rows = online_rows(algo, params, xs, ys)
    assert max(np.abs(r["grads"]["inp.W"]).max() for r in rows) > 1e-3
    for t in range(T):
        r = rows[t]
        g = np.einsum("bk,sko->bos", dl_dout(r, ys[t]), Bm)
        sig = np.sum(g * r["traces"]["fbar.inp.W"], axis=-1)
        close(r["grads"]["inp.W"], r["traces"]["xbar.inp.W"].T @ sig)
        close(r["grads"]["inp.b"], np.einsum("b,bo->o", r["traces"]["xbar.inp.b"], sig))
        dWo, dbo = readout_grads(r, ys[t])
        close(r["grads"]["out.W"], dWo)


def test_random_feedback_matrix_seed_and_scale():
    model = lif_net()
    x = jnp.ones((B_, N_IN))
    h1, h2, h3 = st.etrace.RandomFeedback(seed=7), st.etrace.RandomFeedback(seed=7), st.etrace.RandomFeedback(seed=8)
    h4 = st.etrace.RandomFeedback(seed=7, scale=2.0)
    b1, b2, b3, b4 = (st.etrace.D_RTRL(model, x, signal=h).signal for h in (h1, h2, h3, h4))
    np.testing.assert_array_equal(b1.B[0], b2.B[0])
    assert not np.allclose(b1.B[0], b3.B[0])
    # default scale 1/sqrt(n_out): same draws, rescaled
    np.testing.assert_allclose(b4.B[0], b1.B[0] * 2.0 * np.sqrt(N_OUT), rtol=1e-12)


def test_random_feedback_needs_single_array_output():
    class TwoOutputs(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(N_IN, N_H, key=jax.random.PRNGKey(0))
            self.cell = nn.LIF(N_H, tau=5.0)
            self.out = nn.Linear(N_H, N_OUT, key=jax.random.PRNGKey(1))

        def update(self, x):
            s = self.cell(self.inp(x))
            return self.out(s), s

    model = make(TwoOutputs())
    with pytest.raises(TypeError):
        st.etrace.D_RTRL(model, jnp.ones((B_, N_IN)), signal=st.etrace.RandomFeedback(0))


# ---- (b) KappaFilter ------------------------------------------------------------------------
@pytest.mark.parametrize("kappa", [0.4, 0.85])
def test_kappa_filter_d_rtrl_recursion_and_gradient(x64, kappa):
    model = lif_net()
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, jnp.asarray(xs[0]), signal=st.etrace.KappaFilter(kappa))
    plain = st.etrace.D_RTRL(model, jnp.asarray(xs[0]))
    params, _, traces0 = algo.init_state()
    assert set(traces0) == {"eps.inp.W", "eps.inp.b", "kappa.eps.inp.W", "kappa.eps.inp.b"}
    rows, ref = online_rows(algo, params, xs, ys), online_rows(plain, params, xs, ys)
    assert_spiking(rows)

    ebar = {n: np.zeros_like(traces0[n]) for n in ("eps.inp.W", "eps.inp.b")}
    differs = 0.0
    for t in range(T):
        r, p = rows[t], ref[t]
        for n in ebar:
            # the unfiltered traces are D-RTRL's own; the filtered ones follow the recursion
            np.testing.assert_array_equal(r["traces"][n], p["traces"][n])
            ebar[n] = kappa * ebar[n] + r["traces"][n]
            close(r["traces"]["kappa." + n], ebar[n], rtol=1e-12)
        g = dl_dv(r, ys[t], params)[..., None]       # (B, O, S=1)
        # the hand-computed signal is the one D-RTRL contracts (checked on the plain algorithm)
        close(p["grads"]["inp.W"], np.einsum("bos,bios->io", g, p["traces"]["eps.inp.W"]))
        close(r["grads"]["inp.W"], np.einsum("bos,bios->io", g, ebar["eps.inp.W"]))
        close(r["grads"]["inp.b"], np.einsum("bos,bos->o", g, ebar["eps.inp.b"]))
        dWo, dbo = readout_grads(r, ys[t])
        close(r["grads"]["out.W"], dWo)
        close(r["grads"]["out.b"], dbo)
        differs = max(differs, float(np.abs(r["grads"]["inp.W"] - p["grads"]["inp.W"]).max()))
    assert differs > 1e-3


def test_kappa_filter_es_d_rtrl_filters_each_factor(x64):
    kappa = 0.6
    model = lif_net()
    xs, ys = data()
    algo = st.etrace.ES_D_RTRL(model, jnp.asarray(xs[0]), decay=0.5, signal=st.etrace.KappaFilter(kappa))
    params, _, traces0 = algo.init_state()
    base = ("xbar.inp.W", "fbar.inp.W", "xbar.inp.b")
    assert set(traces0) == set(base) | {"kappa." + n for n in base}
    rows = online_rows(algo, params, xs, ys)
    assert max(np.abs(r["grads"]["inp.W"]).max() for r in rows) > 1e-3
    filt = {n: np.zeros_like(traces0[n]) for n in base}
    for t in range(T):
        r = rows[t]
        for n in base:
            filt[n] = kappa * filt[n] + r["traces"][n]
            close(r["traces"]["kappa." + n], filt[n], rtol=1e-12)
        g = dl_dv(r, ys[t], params)[..., None]
        sig = np.sum(g * filt["fbar.inp.W"], axis=-1)
        close(r["grads"]["inp.W"], filt["xbar.inp.W"].T @ sig)
        close(r["grads"]["inp.b"], np.einsum("b,bo->o", filt["xbar.inp.b"], sig))


def test_kappa_zero_is_no_filter(x64):
    model = lif_net()
    xs, ys = data(steps=8)
    algo = st.etrace.D_RTRL(model, jnp.asarray(xs[0]), signal=st.etrace.KappaFilter(0.0))
    plain = st.etrace.D_RTRL(model, jnp.asarray(xs[0]))
    params, _, _ = algo.init_state()
    rows, ref = online_rows(algo, params, xs, ys), online_rows(plain, params, xs, ys)
    for r, p in zip(rows, ref):
        for n in p["grads"]:
            close(r["grads"][n], p["grads"][n], rtol=1e-13)


# ---- (c) chains and validation --------------------------------------------------------------
@pytest.mark.parametrize("order", ["rf-kappa", "kappa-rf"])
def test_chain_random_feedback_and_kappa(x64, order):
    kappa = 0.7
    model = lif_net()
    xs, ys = data()
    rf, kf = st.etrace.RandomFeedback(seed=11), st.etrace.KappaFilter(kappa)
    hooks = [rf, kf] if order == "rf-kappa" else (kf, rf)
    algo = st.etrace.D_RTRL(model, jnp.asarray(xs[0]), signal=hooks)
    assert isinstance(algo.signal, Chain)
    params, _, traces0 = algo.init_state()
    assert "kappa.eps.inp.W" in traces0
    bound_rf = [h for h in algo.signal.hooks if isinstance(h, st.etrace.RandomFeedback)][0]
    Bm = np.asarray(bound_rf.B[0])
    rows = online_rows(algo, params, xs, ys)
    assert max(np.abs(r["grads"]["inp.W"]).max() for r in rows) > 1e-3
    ebar = {n: np.zeros_like(traces0[n]) for n in ("eps.inp.W", "eps.inp.b")}
    for t in range(T):
        r = rows[t]
        for n in ebar:
            ebar[n] = kappa * ebar[n] + r["traces"][n]
        g = np.einsum("bk,sko->bos", dl_dout(r, ys[t]), Bm)
        close(r["grads"]["inp.W"], np.einsum("bos,bios->io", g, ebar["eps.inp.W"]))
        close(r["grads"]["inp.b"], np.einsum("bos,bos->o", g, ebar["eps.inp.b"]))
        dWo, _ = readout_grads(r, ys[t])
        close(r["grads"]["out.W"], dWo)


@pytest.mark.parametrize("kappa", [1.0, -0.1, 1.5])
def test_invalid_kappa_raises(kappa):
    with pytest.raises(ValueError):
        st.etrace.KappaFilter(kappa)


@pytest.mark.parametrize("signal", [lambda: st.etrace.RandomFeedback(0), lambda: st.etrace.KappaFilter(0.5),
                                    lambda: [st.etrace.RandomFeedback(0), st.etrace.KappaFilter(0.5)]],
                         ids=["random-feedback", "kappa", "chain"])
@pytest.mark.parametrize("cls", [st.etrace.D_RTRL, st.etrace.ES_D_RTRL], ids=["d-rtrl", "es-d-rtrl"])
def test_signal_with_multi_step_raises(signal, cls):
    model = lif_net()
    kw = dict(decay=0.5) if cls is st.etrace.ES_D_RTRL else {}
    with pytest.raises(ValueError):
        cls(model, jnp.ones((B_, N_IN)), vjp_method="multi-step", signal=signal(), **kw)
    # the same hook is accepted with the default single-step VJP
    cls(model, jnp.ones((B_, N_IN)), signal=signal(), **kw)


def test_as_signal():
    assert type(as_signal(None)) is LearningSignal
    kf = st.etrace.KappaFilter(0.5)
    assert as_signal(kf) is kf
    chain = as_signal([kf, st.etrace.RandomFeedback(0)])
    assert isinstance(chain, Chain) and chain.hooks[0] is kf
    with pytest.raises(TypeError):
        as_signal("kappa")
    with pytest.raises(TypeError):
        st.etrace.D_RTRL(lif_net(), jnp.ones((B_, N_IN)), signal=0.5)


def test_one_hook_object_serves_two_algorithms(x64):
    """bind() fits a copy per algorithm: sharing a hook neither breaks nor silently disables it."""
    model = lif_net()
    x = jnp.ones((B_, N_IN))
    kf = st.etrace.KappaFilter(0.5)
    a1 = st.etrace.D_RTRL(model, x, signal=kf)
    a2 = st.etrace.ES_D_RTRL(model, x, decay=0.5, signal=kf)
    for algo in (a1, a2):
        p, h, tr = algo.init_state()
        _, _, tr = algo(p, h, tr, x)
        _, _, tr = algo(p, h, tr, x)
        filtered = [n for n in tr if n.startswith("kappa.")]
        assert filtered and all(float(np.abs(tr[n]).max()) > 0 for n in filtered)
