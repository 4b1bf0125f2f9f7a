"""Forecast(channels, horizon): exogenous input channels and multi-step-ahead forecasts,
checked against numpy recomputations."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

T = 40


def two_channels(T=T, dtype=np.float32):
    rng = np.random.default_rng(7)
    t = np.arange(T)
    return np.stack([np.sin(0.3 * t), 20 * rng.normal(size=T)], axis=1).astype(dtype)


def test_exogenous_channels_predict_only_the_chosen_ones():
    """Channel 1 (loud noise) is only an input: the prediction has shape (1,) and the loss
    reported at step t+1 is (prediction_t - x_{t+1}[0])^2."""
    xs = two_channels()
    L = st.OnlineLearner(nn.Stack("gru", n_in=2, n_hidden=8, n_out=1), np.zeros(2, np.float32),
                         mode=st.Forecast(channels=[0]), optimizer=optax.adam(1e-2))
    preds, losses = [], []
    for x in xs:
        r = L.step(x)
        assert r.prediction.shape == (1,)
        preds.append(r.prediction)
        losses.append(r.loss[0])
    preds, losses = np.array(preds), np.array(losses)
    assert np.isnan(losses[0])
    want = (preds[:-1, 0].astype(np.float64) - xs[1:, 0]) ** 2
    np.testing.assert_allclose(losses[1:], want, rtol=1e-5, atol=1e-7)
    assert L.stats()["updates"] == T - 1


def test_horizon_step_one_equals_the_one_step_learner():
    xs = two_channels()[:, :1]
    make = lambda mode: st.OnlineLearner(nn.Stack("gru", n_in=1, n_hidden=8, n_out=1), np.zeros(1, np.float32),
                                         mode=mode, optimizer=optax.adam(1e-2))
    L1, L3 = make("forecast"), make(st.Forecast(horizon=3))
    for x in xs:
        a, b = L1.step(x), L3.step(x)
        assert b.prediction.shape == (3, 1)
        np.testing.assert_array_equal(b.prediction[0], a.prediction)
        np.testing.assert_array_equal(b.loss, a.loss)
    for k, v in L1.params.items():     # learning uses step one only
        np.testing.assert_array_equal(L3.params[k], v)


def reservoir_step(params, h, z):
    W_in, b, W = (np.asarray(params[k], np.float64) for k in ("W_in", "b", "W"))
    return np.tanh(z @ W_in + b + h @ W)


def normaliser_update(mean, var, v, rate):
    """The normaliser's statistics after sample v, past its warm-up (float32, as it keeps them)."""
    v, w = np.float32(v), np.float32(rate)
    d = v - mean
    mean2 = mean + w * d
    return mean2, (np.float32(1) - w) * var + w * d * (v - mean2)


@pytest.mark.parametrize("with_transform, ch, rate", [(False, 0, 0.0), (True, 0, 0.0), (True, 1, 0.0), (True, 0, 0.05)],
                         ids=["plain", "normalise-residual", "normalise-residual-channel-1", "normalise-tracking"])
def test_multi_step_rollout_equals_numpy_rollout(x64, with_transform, ch, rate):
    """A frozen reservoir + RLS forecasting channel ch of 2 channels four steps ahead: each
    prediction equals a numpy rollout from the stored hidden state, the readout W and the
    reservoir weights, feeding each prediction back as channel ch and holding the other, as
    if it had arrived: a tracking normaliser (rate > 0) updates its statistics with it."""
    H, warmup = 4, 10
    xs = two_channels(T=60, dtype=np.float64) * [1.0, 0.05] + [3.0, 0.0]
    xs = xs if ch == 0 else xs[:, ::-1].copy()
    transform = st.chain(st.normalise(warmup=warmup, rate=rate), st.residual()) if with_transform else None
    L = st.OnlineLearner(nn.Reservoir(2, 12, seed=3, leak=1.0), np.zeros(2), optimizer="frozen",
                         mode=st.Forecast(channels=(ch,), horizon=H), readout=st.rls(delta=1e-3), transform=transform)
    params = L.params
    checked = 0
    for t, x in enumerate(xs):
        s_before = L.state_dict()
        pred = L.step(x).prediction
        assert pred.shape == (H, 1)
        if t < 2 * warmup or t % 7:
            continue
        s = L.state_dict()
        W = s["readout.W"][0, 0]
        # the hidden state after x_{t-1}, as it was before this step (a frozen model under a
        # readout keeps the state after its last prediction; the rollout starts from it with x_t)
        h = s_before["hidden.h"][0]
        if with_transform:
            mean, var = s["signal.normalise.x.mean"][0], s["signal.normalise.x.var"][0]
        else:
            mean, scale = np.zeros(2), np.ones(2)
        xi = x.copy()
        for k in range(H):
            if with_transform:
                if k:       # a fed-back prediction, observed as if it had arrived
                    mean, var = normaliser_update(mean, var, xi, rate)
                scale = np.sqrt(var.astype(np.float64) + 1e-8)
            z = (xi - mean) / scale
            h = reservoir_step(params, h, z)
            y = np.concatenate([h, z, [1.0]]) @ W
            y = xi[ch] + scale[ch] * y if with_transform else y     # residual, in user units
            # (the normaliser keeps float32 statistics: ~1e-9 relative, ~1e-6 where they move)
            np.testing.assert_allclose(pred[k], y, rtol=(1e-5 if rate else 1e-7) if with_transform else 1e-10, atol=1e-10)
            xi = xi.copy()
            xi[ch] = y[0]
        checked += 1
        assert np.array_equal(s_before["pending.x"][0], xs[t - 1])
    assert checked >= 4


def test_bad_forecast_options_are_refused():
    with pytest.raises(ValueError, match="channels"):
        st.Forecast(channels=[])
    with pytest.raises(ValueError, match="distinct"):
        st.Forecast(channels=[0, 0])
    with pytest.raises(ValueError, match="horizon"):
        st.Forecast(horizon=0)
    with pytest.raises(ValueError, match=r"channels \[2\] out of range"):
        st.OnlineLearner(nn.Stack("gru", n_in=2, n_hidden=4, n_out=1), np.zeros(2, np.float32),
                         mode=st.Forecast(channels=[2]))
    with pytest.raises(ValueError, match=r"must have shape \(1,\)"):
        st.OnlineLearner(nn.Stack("gru", n_in=2, n_hidden=4, n_out=2), np.zeros(2, np.float32),
                         mode=st.Forecast(channels=[1]))


def test_one_transform_object_serves_learners_with_different_channels():
    """Regression: the transform records the forecast channels when a learner starts; a
    second learner with other channels must not change what the first one predicts."""
    xs = np.stack([np.sin(0.3 * np.arange(30)), 100 + 50 * np.cos(0.2 * np.arange(30))], 1).astype(np.float32)

    def make(tf, ch):
        return st.OnlineLearner(nn.Reservoir(2, 8, seed=0), np.zeros(2, np.float32), optimizer="frozen",
                                readout=st.rls(), mode=st.Forecast(channels=ch), transform=tf)
    shared = st.chain(st.normalise(warmup=5), st.residual())
    a, _ = make(shared, (0,)), make(shared, (1,))
    fresh = make(st.chain(st.normalise(warmup=5), st.residual()), (0,))
    for x in xs:
        np.testing.assert_array_equal(a.step(x).prediction, fresh.step(x).prediction)
