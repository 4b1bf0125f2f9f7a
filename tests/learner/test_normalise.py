"""Online normalisation: causal statistics (numpy mean/var of the samples before, then frozen
or an exponential average), predictions in the user's units, no learning during the warm-up,
statistics per slot."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn


def ew_stats(v, warmup, rate):
    """numpy oracle: (mean, var) after each sample; population mean/var of the first `warmup`
    samples, then an exponentially weighted mean and variance (incremental form)."""
    means, vars_ = [], []
    for t in range(len(v)):
        if t < warmup:
            m, s2 = v[:t + 1].mean(0), v[:t + 1].var(0)
        else:
            d = v[t] - m
            m = m + rate * d
            s2 = (1 - rate) * (s2 + rate * d * d)
        means.append(m.copy())
        vars_.append(np.asarray(s2).copy())
    return np.array(means), np.array(vars_)


@pytest.mark.parametrize("rate", [0.0, 0.05])
def test_statistics_are_numpy_mean_var_then_frozen_or_exponential(rate):
    """Supervised, 2 input channels of different scales, 1 target: after step t the input and
    target statistics are those of samples 0..t (i.e. the ones step t+1 uses)."""
    warmup, T = 12, 40
    rng = np.random.default_rng(0)
    xs = (rng.normal(size=(T, 2)) * [3.0, 0.1] + [10.0, -2.0]).astype(np.float32)
    ys = (rng.normal(size=(T, 1)) * 50 + 7).astype(np.float32)
    L = st.OnlineLearner(nn.Stack("gru", n_in=2, n_hidden=8, n_out=1), np.zeros(2, np.float32),
                         transform=st.normalise(warmup=warmup, rate=rate), optimizer=optax.sgd(1e-3))
    mx, vx = ew_stats(xs.astype(np.float64), warmup, rate)
    my, vy = ew_stats(ys.astype(np.float64), warmup, rate)
    for t in range(T):
        L.step(xs[t], ys[t])
        s = L.state_dict()
        np.testing.assert_allclose(norm(s, "x.mean")[0], mx[t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(norm(s, "x.var")[0], vx[t], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(norm(s, "y.mean")[0], my[t], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(norm(s, "y.var")[0], vy[t], rtol=1e-4, atol=1e-4)
    if rate == 0.0:   # frozen: the statistics of the warm-up samples, exactly
        np.testing.assert_allclose(norm(s, "x.mean")[0], xs[:warmup].astype(np.float64).mean(0),
                                   rtol=1e-5)
        np.testing.assert_allclose(norm(s, "y.var")[0], ys[:warmup].astype(np.float64).var(0),
                                   rtol=1e-4)


def norm(state, key):
    """A normaliser's statistic from state_dict (alone, or as part of a chain)."""
    return state.get(f"signal.{key}", state.get(f"signal.normalise.{key}"))


def reservoir_numpy(params, z_seq, h0=None):
    """Leak-1 reservoir re-implemented in numpy: h_t = tanh(z_t W_in + b + h_{t-1} W)."""
    W_in, b, W = (np.asarray(params[k], np.float64) for k in ("W_in", "b", "W"))
    h = np.zeros(W.shape[0]) if h0 is None else h0
    hs = []
    for z in z_seq:
        h = np.tanh(z @ W_in + b + h @ W)
        hs.append(h)
    return np.array(hs)


def test_predictions_come_back_in_user_units(x64):
    """A frozen reservoir + RLS + normalise + residual on 500 + 1000 sin: every prediction
    equals the numpy recomputation x_t + s (r_t W) from the frozen statistics, the readout
    W and the reservoir weights; and the predictions track the signal in its own units."""
    warmup, T = 20, 160
    t = np.arange(T + 1)
    sig = (500.0 + 1000.0 * np.sin(0.2 * t))[:, None]
    L = st.OnlineLearner(nn.Reservoir(1, 12, seed=1), np.zeros(1), mode="forecast", optimizer="frozen",
                         readout=st.rls(delta=1e-3), transform=st.chain(st.normalise(warmup=warmup), st.residual()))
    params = L.params
    mean, var = sig[:warmup].mean(0), sig[:warmup].var(0)
    scale = np.sqrt(var + 1e-8)
    preds = []
    for i in range(T):
        pred = L.step(sig[i]).prediction
        preds.append(pred)
        if i >= warmup + 5 and i % 10 == 0:
            s = L.state_dict()
            z = (sig[:i + 1] - mean) / scale       # inputs in the frozen units (n >= warmup)
            # the model state consumed x_0..x_i; the stats for earlier steps differ, so rebuild
            # the hidden state with the encodings the learner actually used at each step
            zs = []
            for j in range(i + 1):
                n = j + 1
                m_j = sig[:min(n, warmup)].mean(0)
                v_j = sig[:min(n, warmup)].var(0)
                s_j = np.sqrt(v_j + 1e-8) if n >= 2 else 1.0
                zs.append((sig[j] - m_j) / s_j)
            h = reservoir_numpy(params, np.array(zs))[-1]
            r = np.concatenate([h, z[-1], [1.0]])
            want = sig[i] + scale * (r @ s["readout.W"][0, 0])
            # the normaliser keeps its statistics in float32: ~1e-8 relative
            np.testing.assert_allclose(pred, want, rtol=1e-6)
    preds = np.array(preds)[warmup + 40:, 0]
    target = sig[warmup + 41:T + 1, 0]
    nrmse = np.sqrt(np.mean((preds - target) ** 2)) / target.std()
    assert nrmse < 0.05, nrmse          # in the signal's units: centred near 500, amplitude 1000
    assert abs(preds.mean() - 500) < 200 and preds.max() > 1200


def test_learning_waits_for_the_warm_up():
    """Forecast step t learns from the prediction made at t-1 once t samples were observed:
    weights, readout and optimizer counters stay put for steps 0..warmup-1."""
    warmup = 10
    L = st.OnlineLearner(nn.Reservoir(1, 8, seed=0), np.zeros(1, np.float32), mode="forecast",
                         optimizer=optax.adam(1e-2), readout=st.rls(), transform=st.normalise(warmup=warmup))
    p0 = L.params
    xs = np.sin(0.3 * np.arange(warmup + 3, dtype=np.float32))[:, None] * 4 + 1
    for t in range(warmup):
        r = L.step(xs[t])
        assert not r.applied and np.isnan(r.loss).all(), t
        assert L.stats()["updates"] == 0
        assert not np.any(L.state_dict()["readout.W"]), t
        for k, v in L.params.items():
            assert np.array_equal(v, p0[k]), (t, k)
    r = L.step(xs[warmup])
    assert r.applied and np.isfinite(r.loss).all()
    assert np.any(L.state_dict()["readout.W"])
    # the first hybrid gradient is -W e with the readout W still 0; from the next step on it moves
    L.step(xs[warmup + 1])
    assert any(not np.array_equal(v, p0[k]) for k, v in L.params.items())


def test_statistics_per_slot_and_inactive_steps_not_counted():
    """Three streams of different scales; slot 1 is inactive on some steps: each slot's
    statistics are numpy's over its own accepted samples."""
    warmup, T = 15, 30
    rng = np.random.default_rng(3)
    scales, offsets = np.array([1.0, 100.0, 0.01]), np.array([0.0, -50.0, 3.0])
    xs = (rng.normal(size=(T, 3, 1)) * scales[:, None] + offsets[:, None]).astype(np.float32)
    active = np.ones((T, 3), bool)
    active[[2, 5, 6, 11], 1] = False
    xs[7, 2, 0] = np.nan          # refused: a non-finite sample changes no statistics
    L = st.OnlineLearner(nn.Reservoir(1, 8, seed=0), np.zeros(1, np.float32), mode="forecast", slots=3,
                         optimizer="frozen", readout=st.rls(), transform=st.normalise(warmup=warmup))
    for t in range(T):
        L.step(xs[t], active=active[t])
    s = L.state_dict()
    for i in range(3):
        seen = xs[active[:, i], i].astype(np.float64)
        seen = seen[np.isfinite(seen[:, 0])][:warmup]
        np.testing.assert_allclose(norm(s, "x.mean")[i], seen.mean(0), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(norm(s, "x.var")[i], seen.var(0), rtol=1e-4)
    assert list(norm(s, "n")) == [T, T - 4, T - 1]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="warmup"):
        st.normalise(warmup=0)
    with pytest.raises(ValueError, match="rate"):
        st.normalise(rate=1.0)
    with pytest.raises(ValueError, match="eps"):
        st.normalise(eps=0.0)


def test_reset_slot_gives_a_fresh_normaliser_readout_and_metrics():
    """A new stream in slot 1 starts from nothing (own warm-up, empty readout, no metrics);
    slot 0 is untouched."""
    L = st.OnlineLearner(nn.Reservoir(1, 8, seed=0), np.zeros(1, np.float32), mode="forecast", slots=2,
                         optimizer="frozen", readout=st.rls(), transform=st.normalise(warmup=5))
    xs = (np.sin(0.3 * np.arange(20))[:, None, None] * [[5.0], [9.0]] + 2).astype(np.float32)
    for x in xs:
        L.step(x)
    before = L.state_dict()
    L.reset_slot(1)
    after, m = L.state_dict(), L.stats()["metrics"]
    for k, v in after.items():
        if v.ndim and v.shape[0] == 2 and not k.startswith("params."):
            assert np.array_equal(v[0], before[k][0], equal_nan=True), k
    assert norm(after, "n")[1] == 0 and not np.any(after["readout.W"][1, 0])
    np.testing.assert_array_equal(after["readout.P"][1, 0], np.eye(10) / 1e-4)
    assert m["n"][1] == 0 and np.isnan(m["mse"][1]) and m["n"][0] == 19
    L.step(np.array([[1.0], [123.0]], np.float32))
    np.testing.assert_allclose(norm(L.state_dict(), "x.mean")[1], [123.0])


def test_residual_needs_forecast_mode():
    with pytest.raises(ValueError, match="forecast mode"):
        st.OnlineLearner(nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32),
                         transform=st.chain(st.normalise(), st.residual()))
