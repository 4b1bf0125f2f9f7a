"""Rolling prequential metrics: stats()["metrics"] equals a numpy exponentially weighted,
bias-corrected recomputation from the run's own predictions and targets."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn


def ew_metrics(preds, targets, window):
    """numpy oracle over the scored steps: weights a(1-a)^(n-1-i), normalised by their sum."""
    preds, targets = np.asarray(preds, np.float64), np.asarray(targets, np.float64)
    n = len(preds)
    a = 1.0 / window
    w = a * (1 - a) ** np.arange(n - 1, -1, -1)
    w = w / w.sum()
    avg = lambda v: (w[:, None] * v).sum(0)
    e = preds - targets
    se, ae = avg(e ** 2), avg(np.abs(e))
    var = avg(targets ** 2) - avg(targets) ** 2
    return {"mse": se.mean(), "mae": ae.mean(), "nrmse": np.sqrt(se.sum() / var.sum())}


def check(metrics, slot, want, n):
    assert metrics["n"][slot] == n
    for k in ("mse", "mae", "nrmse"):
        np.testing.assert_allclose(metrics[k][slot], want[k], rtol=2e-4, err_msg=k)


def test_forecast_metrics_equal_numpy_recomputation():
    window, T = 25, 120
    t = np.arange(T)
    xs = np.stack([np.sin(0.2 * t), 2 + 0.5 * np.cos(0.13 * t)], axis=1).astype(np.float32)
    L = st.OnlineLearner(nn.Stack("gru", n_in=2, n_hidden=8, n_out=2), np.zeros(2, np.float32),
                         mode="forecast", optimizer=optax.adam(1e-2), window=window)
    m = L.stats()["metrics"]
    assert m["n"][0] == 0 and np.isnan(m["mse"][0]) and np.isnan(m["nrmse"][0])
    preds = []
    for i, x in enumerate(xs):
        preds.append(L.step(x).prediction)
        if i in (3, 30, T - 1):   # early (bias correction matters), about one window, several
            check(L.stats()["metrics"], 0, ew_metrics(preds[:i], xs[1:i + 1], window), i)


def test_supervised_metrics_skip_unscored_steps_per_slot():
    """Two slots: slot 0 has a non-finite target on one step, slot 1 does not learn on some
    steps; neither counts in the metrics, which are kept per slot in user units."""
    window, T = 10, 60
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(T, 2, 1)).astype(np.float32)
    ys = (np.concatenate([3 * xs, -xs], axis=2) * [[10.0], [1.0]] + 100).astype(np.float32)
    ys[17, 0, 1] = np.nan
    learn = np.ones((T, 2), bool)
    learn[[5, 6, 40], 1] = False
    L = st.OnlineLearner(nn.Stack("gru", n_in=1, n_hidden=8, n_out=2), np.zeros(1, np.float32),
                         slots=2, optimizer=optax.adam(1e-2), window=window,
                         transform=st.normalise(warmup=5))
    preds = np.array([L.step(xs[t], ys[t], learn=learn[t]).prediction for t in range(T)])
    m = L.stats()["metrics"]
    for slot in range(2):
        scored = learn[:, slot] & np.isfinite(ys[:, slot]).all(1)
        check(m, slot, ew_metrics(preds[scored, slot], ys[scored, slot], window), scored.sum())
    assert m["nrmse"][0] != m["nrmse"][1]


def test_window_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="window"):
        st.OnlineLearner(nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32), window=0)
