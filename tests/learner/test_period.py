"""The online period detector (learner/period.py): its autocorrelation against numpy written from
the module's equations, and the seasons it reports on generated series whose periods are known
(one season, two seasons, noise, a trend) and none on white noise, a random walk or a trend."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from streamtrace.learner import period as pd

pytestmark = pytest.mark.usefixtures("x64")


class NpPeriod:
    """The detector's equations in plain numpy, one channel."""

    def __init__(self, max_period, window):
        self.P, self.window, self.k = max_period, window, 0
        self.level = self.mu = self.v = 0.0
        self.d, self.c = [], np.zeros(max_period + 1)        # c[p]: lag p's running product
        self.found, self.cand, self.held = (0, 0), (0, 0), 0  # what settle adopted, its candidate

    def update(self, y):
        if self.k >= 1:
            d = y - self.level
            a = max(1 / self.k, 1 / self.window)
            self.mu += a * (d - self.mu)
            self.v += a * (d * d - self.v)
            for p in range(1, self.P + 1):
                if len(self.d) >= p:
                    ap = max(1 / (len(self.d) - p + 1), 1 / self.window)
                    self.c[p] += ap * (d * self.d[-p] - self.c[p])
            self.d.append(d)
        self.k += 1
        self.level += max(1 / self.k, 1 / self.P) * (y - self.level)

    def r(self):
        den = self.v - self.mu ** 2
        return np.array([(self.c[p] - self.mu ** 2) / den if len(self.d) - p >= 1 else 0.0
                         for p in range(1, self.P + 1)])


    def seasons(self, threshold=0.3, share=0.5, margin=0.1, prominence=0.3, repeat=0.5):
        """(first, second): the rules of the module's docstring, written out."""
        r = self.r()
        cand = [p for p in range(2, self.P) if r[p - 1] >= r[p - 2] and r[p - 1] >= r[p] and r[p - 1] > threshold
                and r[p - 1] - min(r[:p]) > prominence and len(self.d) - p >= p]
        if not cand:
            return 0, 0
        best = max(cand, key=lambda p: (r[p - 1], -p))
        first = next(p for p in cand if r[p - 1] >= share * r[best - 1])
        if 2 * first <= self.P and len(self.d) >= 8 * first and r[2 * first - 1] <= repeat:    # must repeat
            return 0, 0
        return first, best if best != first and r[best - 1] > r[first - 1] + margin else 0

    def settle(self, every=4, hold=2):
        """After ``update``: search every ``every`` targets; adopt a result ``hold`` searches
        in a row gave (``found``, what the experts use)."""
        if self.k % every == 0:
            got = self.seasons()
            self.held = self.held + 1 if got == self.cand else 1
            self.cand = got
            if self.held >= hold:
                self.found = got
        return self.found


def _detect(y, max_period, window=500):
    """The jax detector run over y (T, C) on one slot: (first, second) per channel and r."""
    step = jax.jit(pd.update, static_argnums=3)
    s = pd.init(1, y.shape[1], max_period, jnp.float64)
    for v in y:
        s = step(s, jnp.asarray(v[None]), jnp.array([True]), window)
    first, second = pd.periods(s)
    return np.asarray(first)[0], np.asarray(second)[0], np.asarray(pd.autocorrelation(s))[0]


def test_autocorrelation_equals_numpy():
    rng = np.random.default_rng(0)
    t = np.arange(150)
    y = np.stack([np.sin(2 * np.pi * t / 9) + 0.3 * rng.standard_normal(150), 0.02 * t + rng.standard_normal(150)], 1)
    _, _, r = _detect(y, 16, window=60)          # window < length: the exponential phase is covered
    for ch in range(2):
        ref = NpPeriod(16, 60)
        for v in y[:, ch]:
            ref.update(v)
        np.testing.assert_allclose(r[:, ch], ref.r(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_seasons_follow_the_rules(seed):
    """The reported seasons against numpy's reading of the rules, on mixed seasonal series."""
    rng = np.random.default_rng(seed)
    t = np.arange(260)
    y = np.stack([np.sin(2 * np.pi * t / rng.integers(4, 14)) * rng.uniform(0, 2) +
                  np.sin(2 * np.pi * t / rng.integers(14, 30)) * rng.uniform(0, 2) +
                  rng.uniform(0.1, 1.0) * rng.standard_normal(260) for _ in range(4)], 1)
    first, second, _ = _detect(y, 36, window=100)
    for ch in range(4):
        ref = NpPeriod(36, 100)
        for v in y[:, ch]:
            ref.update(v)
        assert (first[ch], second[ch]) == ref.seasons()


def _monthly(n, rng, period=12, noise=0.3, trend=0.05):
    t = np.arange(n)
    return 10 + trend * t + np.sin(2 * np.pi * t / period) + 0.5 * np.cos(4 * np.pi * t / period) + \
        noise * rng.standard_normal(n)


@pytest.mark.parametrize("period,n", [(12, 150), (12, 300), (7, 120), (24, 200)])
def test_one_season_with_trend_and_noise(period, n):
    first, second, _ = _detect(_monthly(n, np.random.default_rng(period + n), period)[:, None], 40)
    assert (first[0], second[0]) == (period, 0)


def test_two_seasons_a_day_and_a_week():
    """Half-hourly: a daily cycle of 48 samples and a weekend of 2 days in 7 (336 samples)."""
    rng = np.random.default_rng(1)
    t = np.arange(48 * 7 * 4)
    y = np.sin(2 * np.pi * t / 48) + 0.8 * ((t // 48) % 7 >= 5) + 0.2 * rng.standard_normal(len(t))
    first, second, _ = _detect(y[:, None], 400)
    assert (first[0], second[0]) == (48, 336)


@pytest.mark.parametrize("kind", ["white", "random walk", "trend", "ar1"])
def test_none_without_a_season(kind):
    rng = np.random.default_rng(2)
    e = rng.standard_normal((300, 3))
    y = {"white": e, "random walk": np.cumsum(e, axis=0), "trend": 0.1 * np.arange(300)[:, None] + e,
         "ar1": np.array([np.convolve(e[:, c], 0.9 ** np.arange(60))[:300] for c in range(3)]).T}[kind]
    first, second, _ = _detect(y, 40)
    assert (first == 0).all() and (second == 0).all()


def test_channels_and_slots_apart():
    """Two channels with different seasons in one slot; a slot that is not ``ok`` learns nothing."""
    rng = np.random.default_rng(3)
    a, b = _monthly(200, rng, 12), _monthly(200, rng, 5)
    first, _, _ = _detect(np.stack([a, b], 1), 30)
    assert list(first) == [12, 5]
    s = pd.init(2, 1, 30, jnp.float64)
    for v in a:
        s = pd.update(s, jnp.array([[v], [v]]), jnp.array([True, False]), 500)
    f, _ = pd.periods(s)
    assert list(np.asarray(f)[:, 0]) == [12, 0] and list(np.asarray(s["k"])) == [200, 0]


def test_settle_holds_a_season_until_two_searches_agree():
    """A season of 12 that turns into one of 7 half-way, noisy enough that single searches flip:
    every step's adopted seasons equal numpy's reading of the rule (search every 4 targets,
    adopt what 2 searches in a row gave), a result that one search gave and the next did not
    never reaches ``found``, and both seasons are adopted in turn."""
    rng = np.random.default_rng(7)
    t = np.arange(400)
    y = np.where(t < 200, np.sin(2 * np.pi * t / 12), np.sin(2 * np.pi * t / 7)) + 0.6 * rng.standard_normal(400)
    update = jax.jit(pd.update, static_argnums=3)
    settle = jax.jit(pd.settle)
    s, ref = pd.init(1, 1, 30, jnp.float64), NpPeriod(30, 60)
    got, want, searches = [], [], []            # searches: (step, what numpy's search gave)
    for i, v in enumerate(y):
        s = settle(update(s, jnp.array([[v]]), jnp.array([True]), 60), jnp.array([True]))
        ref.update(v)
        if ref.k % 4 == 0:
            searches.append((i, ref.seasons()))
        want.append(ref.settle())
        got.append(tuple(int(np.asarray(p)[0, 0]) for p in pd.found(s)))
    assert got == want
    raw = [r for _, r in searches]
    assert any(b != a and b != c for a, b, c in zip(raw, raw[1:], raw[2:])), "single searches should flip"
    at = {i: j for j, (i, _) in enumerate(searches)}
    for i in range(1, len(got)):
        if got[i] != got[i - 1]:                # adopted at a search that repeats the one before
            assert i in at and at[i] >= 1 and raw[at[i]] == raw[at[i] - 1] == got[i]
    assert 12 in {f for f, _ in got[:200]} and 7 in {f for f, _ in got[200:]}


def test_a_wandering_cycle_is_no_season():
    """Cycles of 9 to 14 steps (as the sunspots' years): once 8 cycles are seen they correlate
    at one cycle but not at two, so no season is reported; the same series with every cycle
    12 steps long reports 12."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(9, 15, 40)
    wander = np.concatenate([np.sin(np.pi * np.arange(n) / n) ** 2 for n in lengths])[:400]
    fixed = np.tile(np.sin(np.pi * np.arange(12) / 12) ** 2, 34)[:400]
    for y, want in [(wander, 0), (fixed, 12)]:
        first, _, r = _detect((y + 0.05 * rng.standard_normal(400))[:, None], 40)
        assert first[0] == want, (first, r[:30, 0].round(2))
