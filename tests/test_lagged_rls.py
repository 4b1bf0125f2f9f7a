"""The linear expert (learner/lagged_rls.py) against a numpy recursive least squares written from its
equations: the same regressors built from the history, the same forecasts and weights; and it
learns the seasonal naive forecast with drift on a series made of exactly that."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from streamtrace.learner import lagged_rls as lr

pytestmark = pytest.mark.usefixtures("x64")
LAM, DELTA, WINDOW = 0.98, 0.1, 30


def np_rls(y, mean, p1, p2, depth):
    """y (T,), mean (T,): the running mean the expert is given before each target; p1, p2 lags."""
    w, P, q, hist, preds = np.zeros(6), np.eye(6) / DELTA, 0.0, [], []

    def diff(lag):
        return hist[-lag] - hist[-lag - 1] if lag >= 1 and len(hist) >= lag + 1 and lag <= depth - 1 else 0.0

    for t in range(len(y)):
        last = hist[-1] if hist else mean[t]
        s = np.sqrt(q + 1e-12 * (1 + (hist[-1] if hist else 0.0) ** 2))
        z = np.array([last - mean[t], diff(1), diff(2), diff(p1), diff(p2), 0.0]) / s
        z[5] = 1.0
        preds.append((hist[-1] if hist else 0.0) + s * w @ z)
        if len(hist) >= 2:                      # the RLS step, from the third target on
            k = P @ z / (LAM + z @ P @ z)
            w = w + k * ((y[t] - hist[-1]) / s - w @ z)
            P = (P - np.outer(k, z @ P)) / LAM
        if hist:
            q += max(1 / len(hist), 1 / WINDOW) * ((y[t] - hist[-1]) ** 2 - q)
        hist.append(y[t])
    return np.array(preds), w


def _run(y, mean, p1, p2, depth):
    s = lr.init(1, 1, depth, jnp.float64, delta=DELTA)

    @jax.jit
    def step(s, y, m):
        z = lr.features(s, jnp.array([[p1]]), jnp.array([[p2]]), m)
        return lr.update(s, z, y, jnp.array([True]), LAM, WINDOW), lr.predict(s, z)
    preds = []
    for v, m in zip(y, mean):
        s, p = step(s, jnp.array([[v]]), jnp.array([[m]]))
        preds.append(float(p[0, 0]))
    return np.array(preds), np.asarray(s["w"])[0, 0]


@pytest.mark.parametrize("p1,p2", [(5, 0), (4, 9), (0, 0)])
def test_forecasts_and_weights_equal_numpy(p1, p2):
    rng = np.random.default_rng(p1 + p2)
    t = np.arange(120)
    y = 3 + 0.05 * t + np.sin(2 * np.pi * t / 5) + 0.3 * rng.standard_normal(120)
    mean = np.cumsum(y) / np.arange(1, 121)
    mean = np.concatenate([[0.0], mean[:-1]])            # the mean before each target
    got, w = _run(y, mean, p1, p2, 12)
    want, w_np = np_rls(y, mean, p1, p2, 12)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(w, w_np, rtol=1e-7, atol=1e-8)


def test_learns_the_seasonal_naive_with_drift():
    """y_t = y_{t-1} + y_{t-6} - y_{t-7} exactly (a season of 6 on a trend): after 120 targets the
    forecasts err less than a tenth of persistence's (which errs by a season's step each time)."""
    rng = np.random.default_rng(0)
    season = rng.standard_normal(6)
    y = np.array([0.2 * i + season[i % 6] for i in range(150)])
    mean = np.concatenate([[0.0], (np.cumsum(y) / np.arange(1, 151))[:-1]])
    preds, w = _run(y, mean, 6, 0, 10)
    late = slice(120, 150)
    assert np.sqrt(np.mean((preds[late] - y[late]) ** 2)) < 0.1 * np.sqrt(np.mean(np.diff(y)[119:149] ** 2))
