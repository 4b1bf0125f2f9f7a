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


class NpRLS:
    """The linear expert's equations in numpy, one channel: ``predict`` the next target from the
    history and the seasons, then ``learn`` it."""

    def __init__(self, depth, lam=LAM, delta=DELTA, window=WINDOW, restart=False):
        self.depth, self.lam, self.window, self.delta, self.restart = depth, lam, window, delta, restart
        self.w, self.P, self.q, self.hist, self.z = np.zeros(7), np.eye(7) / delta, 0.0, [], None
        self.season = 0                     # the season learnt with (restart: a fresh fit when one is found)

    def _diff(self, lag):
        h = self.hist
        return h[-lag] - h[-lag - 1] if 1 <= lag <= self.depth - 1 and len(h) >= lag + 1 else 0.0

    def predict(self, p1, p2):
        h = self.hist
        p1 = min(p1, self.depth - 1)
        self.p1 = p1
        self.s = np.sqrt(self.q + 1e-12 * (1 + (h[-1] if h else 0.0) ** 2))
        lags = [1, 2] + ([p1, p1 + 1, p1 + 2] if p1 else [0, 0, 0]) + [min(p2, self.depth - 1)] + \
            [2 * p1 if p1 and 2 * p1 < self.depth else 0]
        self.z = np.clip(np.array([self._diff(q) for q in lags]) / self.s, -2.5, 2.5)
        return (h[-1] if h else 0.0) + self.s * self.w @ self.z

    def learn(self, y):
        h, z = self.hist, self.z
        if self.restart and self.p1 and not self.season:
            self.w, self.P, self.season = np.zeros(7), np.eye(7) / self.delta, self.p1
        if len(h) >= 2:                      # the RLS step, from the third target on
            k = self.P @ z / (self.lam + z @ self.P @ z)
            self.w = self.w + k * ((y - h[-1]) / self.s - self.w @ z)
            self.P = (self.P - np.outer(k, z @ self.P)) / self.lam
        if h:
            self.q += max(1 / len(h), 1 / self.window) * ((y - h[-1]) ** 2 - self.q)
        h.append(y)


def np_rls(y, p1, p2, depth):
    """y (T,); p1, p2 lags."""
    r, preds = NpRLS(depth), []
    for t in range(len(y)):
        preds.append(r.predict(p1, p2))
        r.learn(y[t])
    return np.array(preds), r.w


def _run(y, p1, p2, depth):
    s = lr.init(1, 1, depth, jnp.float64, delta=DELTA)

    @jax.jit
    def step(s, y):
        z = lr.features(s, jnp.array([[p1]]), jnp.array([[p2]]))
        return lr.update(s, z, y, jnp.array([True]), LAM, WINDOW), lr.predict(s, z)
    preds = []
    for v in y:
        s, p = step(s, jnp.array([[v]]))
        preds.append(float(p[0, 0]))
    return np.array(preds), np.asarray(s["w"])[0, 0]


@pytest.mark.parametrize("p1,p2", [(5, 0), (4, 9), (0, 0)])
def test_forecasts_and_weights_equal_numpy(p1, p2):
    rng = np.random.default_rng(p1 + p2)
    t = np.arange(120)
    y = 3 + 0.05 * t + np.sin(2 * np.pi * t / 5) + 0.3 * rng.standard_normal(120)
    got, w = _run(y, p1, p2, 12)
    want, w_np = np_rls(y, p1, p2, 12)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(w, w_np, rtol=1e-7, atol=1e-8)


def test_a_level_shift_is_clipped_as_numpy_clips_it():
    """A jump of 20 noise deviations: its change, in the regressors at lags 1, 2 and a season
    later, is clipped to 2.5 changes' RMS; forecasts and weights still equal numpy's, and the
    regressors did reach the clip (the case this test is for)."""
    rng = np.random.default_rng(3)
    t = np.arange(90)
    y = np.sin(2 * np.pi * t / 6) + 0.2 * rng.standard_normal(90) + 20.0 * (t >= 50)
    got, w = _run(y, 6, 0, 14)
    want, w_np = np_rls(y, 6, 0, 14)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(w, w_np, rtol=1e-7, atol=1e-8)
    r = NpRLS(14)
    clipped = 0
    for v in y:
        r.predict(6, 0)
        clipped += int(np.any(np.abs(r.z) == 2.5))
        r.learn(v)
    assert clipped >= 3


def test_learns_the_seasonal_naive_with_drift():
    """y_t = y_{t-1} + y_{t-6} - y_{t-7} exactly (a season of 6 on a trend): after 120 targets the
    forecasts err less than a fifth of persistence's (which errs by a season's step each time).
    Not exactly 0: the first targets, learnt before lag 6 existed (its regressor 0), still weigh
    lam^120 ~ 0.09 in the least-squares fit."""
    rng = np.random.default_rng(0)
    season = rng.standard_normal(6)
    y = np.array([0.2 * i + season[i % 6] for i in range(150)])
    preds, w = _run(y, 6, 0, 10)
    late = slice(120, 150)
    assert np.sqrt(np.mean((preds[late] - y[late]) ** 2)) < 0.2 * np.sqrt(np.mean(np.diff(y)[119:149] ** 2))
