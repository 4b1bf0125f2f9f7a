"""The experts combiner (learner/experts.py) against an independent numpy implementation of the
exponentially weighted average forecaster: its weights, its predictions, slots that never see
each other, and a checkpoint round trip that continues bit for bit.

The combiner does not change what the model learns (the model learns from its own loss), so a
learner without it gives the model's predictions, from which numpy computes the mixture."""
import importlib
import re

import jax
import numpy as np

import streamtrace as st
import pytest

from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.learner import OnlineLearner, experts
from streamtrace.nn import Stack
from test_lagged_rls import NpRLS  # numpy oracle of the linear expert
from test_period import NpPeriod  # numpy oracle of the period detector

ETA, WINDOW, CLIP = 3.0, 40, 4.0
experts_module = importlib.import_module("streamtrace.learner.experts")    # (the name is the factory)


def np_mixture(model, targets, *, forecast, period=None, eta=ETA, window=WINDOW, clip=CLIP, max_period=None):
    """model (T, C): the model's prediction at each step; targets (T, C): forecast: the input
    at each step (the target of the previous prediction); supervised: each step's target.
    max_period: detect the period (numpy's learner/period.py, test_period.NpPeriod).
    Returns the mixture's predictions (T, C) and the discounted losses (K, C) at the end."""
    T, C = model.shape
    K = 5 if period or max_period else 3
    lin = [NpRLS(2 * (period or max_period) + 2, lam=0.99, window=window, restart=bool(max_period))
           for _ in range(C)] if K == 5 else []
    L, hist, mean, var = np.zeros((K, C)), [], np.zeros(C), np.zeros(C)
    found = [NpPeriod(max_period, window) for _ in range(C)] if max_period else []

    def seasons(c):
        if period:
            return period, 0
        first, second = found[c].found              # the longer season settled on (learner/period.py)
        return (second, first) if second else (first, 0)

    def seasonal():
        out = np.full(C, np.nan)
        for c in range(C):
            p = seasons(c)[0]
            if p and len(hist) >= p:
                out[c] = hist[-p][c]
        return out

    def linear():           # with a season only (it is computed anyway: its features are learnt from)
        out = np.array([lin[c].predict(*seasons(c)) for c in range(C)])
        return np.where([len(hist) >= 3 and seasons(c)[0] > 0 for c in range(C)], out, np.nan)

    def preds(m):
        n = len(hist)
        e = [m, hist[-1] if n else np.full(C, np.nan), mean.copy() if n else np.full(C, np.nan)]
        if period or max_period:
            e += [seasonal(), linear()]
        return np.array(e)

    def score(m, y):
        e = preds(m)
        avail = ~np.isnan(e)
        if len(hist) >= 2:
            loss = np.minimum((e - y) ** 2 / (var + 1e-12 * (1 + mean ** 2)), clip)
        else:
            loss = np.zeros((K, C))
        # an expert that cannot predict (asleep) is charged the mixture's own loss
        logit = np.where(avail, -eta * L, -np.inf)
        w = np.exp(logit - logit.max(axis=0))
        w /= w.sum(axis=0)
        mixed = np.sum(w * np.nan_to_num(e), axis=0)
        asleep = np.minimum((mixed - y) ** 2 / (var + 1e-12 * (1 + mean ** 2)), clip) if len(hist) >= 2 else 0
        loss = np.where(avail, loss, asleep)
        tau = min(window, 10 + 0.25 * len(hist))           # the losses' memory grows with the stream
        L[:] = (1 - 1 / tau) * L + loss

    def observe(y):
        nonlocal mean, var
        for c, r in enumerate(lin):
            r.predict(*seasons(c))          # the features the target was forecast from
            r.learn(y[c])
        for c, det in enumerate(found):
            det.update(y[c])
            det.settle()
        hist.append(np.array(y, float))
        w = max(1 / len(hist), 1 / window)
        d = y - mean
        mean = mean + w * d
        var = (1 - w) * var + w * d * (y - mean)

    def mix(m):
        e = preds(m)
        avail = ~np.isnan(e)
        logit = np.where(avail, -eta * L, -np.inf)
        w = np.exp(logit - logit.max(axis=0))
        w /= w.sum(axis=0)
        return np.sum(w * np.nan_to_num(e), axis=0)

    out = np.zeros((T, C))
    for t in range(T):
        if forecast:
            if t:
                score(model[t - 1], targets[t])
            observe(targets[t])
            out[t] = mix(model[t])
        else:
            out[t] = mix(model[t])
            score(model[t], targets[t])
            observe(targets[t])
    return out, L


def _series(steps, seed=0, channels=2):
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    return np.sin(0.3 * t + np.arange(channels)) + 0.3 * rng.standard_normal((steps, channels)) + \
        np.cumsum(0.05 * rng.standard_normal((steps, channels)), axis=0)


def _forecaster(combine, slots=None):
    """The default learner (a small one) for two channels; combine: None (off) or experts(...)."""
    d = combine and combine.describe()
    on = {"experts": False} if combine is None else \
        {"experts": True, "period": d["period"] or 0, "max_period": d["max_period"] or 0, "eta": combine.eta,
         "window": combine.window}
    # the learned GRU beside the reservoir left out: the mixture is what is tested here
    cfg = load_config(None, {"model": {"n_in": 2, "n_out": 2, "n_hidden": 12, "seed": 3},
                             "transform": {"normalise_warmup": 20}, "combine": on, "learned": {"stack": ""}})
    assert cfg.model.stack == "reservoir" and cfg.model.precision == 64    # the default learner
    # one model per stream, as the engine runs it (the default's learned GRU would be shared)
    return build_learner(cfg, slots=slots, shared_weights=cfg.engine.shared_weights)


@pytest.mark.parametrize("period,max_period", [(None, None), (7, None), (None, 24)])
def test_forecast_mixture_and_weights_equal_numpy(period, max_period):
    xs = _series(160)
    plain = _forecaster(None)
    model = np.array([plain.step(x).prediction for x in xs])
    mixed = _forecaster(experts(period, eta=ETA, window=WINDOW, max_period=max_period))
    got = np.array([mixed.step(x).prediction for x in xs])
    want, L = np_mixture(model, xs, forecast=True, period=period, max_period=max_period)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(mixed.state_dict()["combine.L"][0], L, rtol=1e-9, atol=1e-12)
    # the mixture is not just the model: persistence and the mean took weight early on
    assert np.abs(got - model).max() > 1e-3
    assert mixed.state_dict()["combine.n"][0] == len(xs)


def test_a_period_is_detected():
    """A noisy cycle of 12 samples: the seasonal expert settles on lag 12 (numpy: the period
    detector's equations) and the mixture beats persistence."""
    rng = np.random.default_rng(4)
    t = np.arange(300)
    y = (np.where(t % 12 < 3, 1.0, 0.0) + 0.05 * rng.standard_normal(300))[:, None]
    model = np.zeros((300, 1))                                  # a model that knows nothing
    want, _ = np_mixture(model, y, forecast=True, max_period=20)
    e = experts(eta=ETA, window=WINDOW, max_period=20)
    s = e.init(1, 1, np.float32)
    got, forecast = [], jax.jit(e.forecast)        # one compiled step, not 300 op-by-op ones
    for i in range(300):
        s, out = forecast(s, y[i][None].astype(np.float32), np.array([i > 0]), np.array([True]),
                            np.zeros((1, 1), np.float32), np.array([True]))
        got.append(np.asarray(out)[0])
    np.testing.assert_allclose(np.array(got), want, rtol=2e-4, atol=2e-4)
    from streamtrace.learner import period
    assert [int(np.asarray(p)[0, 0]) for p in period.found(e.open(s)["season"])] == [12, 0]
    late = slice(200, 299)
    assert np.mean((want[late] - y[1:][late]) ** 2) < 0.2 * np.mean((y[:-1][late] - y[1:][late]) ** 2)


def test_supervised_mixture_equals_numpy():
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((120, 3)).astype(np.float32)
    ys = np.stack([np.convolve(xs[:, 0], [0.5, 0.3, 0.2])[:120], np.sin(np.arange(120) * 0.2)], 1).astype(np.float32)
    make = lambda c: OnlineLearner(Stack("gru", 3, 6, 2, seed=0), np.zeros(3, np.float32), optimizer=st.adam(1e-2), combine=c)
    plain, mixed = make(None), make(experts(eta=ETA, window=WINDOW))
    model = np.array([plain.step(x, y).prediction for x, y in zip(xs, ys)], np.float64)
    got = np.array([mixed.step(x, y).prediction for x, y in zip(xs, ys)], np.float64)
    want, _ = np_mixture(model, ys.astype(np.float64), forecast=False)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_slots_are_independent():
    """Three streams in one learner, stepped at different times: each one's predictions are those
    of a learner that only ever saw that stream."""
    steps = 60
    data = [_series(steps, seed=s) for s in range(3)]
    many = _forecaster(experts(3, eta=ETA, window=WINDOW), slots=3)
    active = np.ones((steps, 3), bool)
    active[10:25, 1] = False                    # stream 1 pauses
    active[::3, 2] = False                      # stream 2 sends every other tick
    got = [[] for _ in range(3)]
    for t in range(steps):
        r = many.step(np.stack([d[t] for d in data]), active=active[t])
        for s in range(3):
            if active[t, s]:
                got[s].append(r.prediction[s])
    for s in range(3):
        one = _forecaster(experts(3, eta=ETA, window=WINDOW))
        alone = [one.step(x).prediction for x in data[s][active[:, s]]]
        np.testing.assert_allclose(np.array(got[s]), np.array(alone), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(period=5), dict(max_period=12)])
def test_checkpoint_round_trip_continues_bit_for_bit(tmp_path, kw):
    xs = _series(80)
    a = _forecaster(experts(**kw, eta=ETA, window=WINDOW))
    for x in xs[:50]:
        a.step(x)
    a.save(tmp_path / "c.ckpt")
    saved = a.state_dict()
    b = _forecaster(experts(**kw, eta=ETA, window=WINDOW))
    b.restore(tmp_path / "c.ckpt")
    for name, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[name], v, err_msg=name)
    pa = np.array([a.step(x).prediction for x in xs[50:]])
    pb = np.array([b.step(x).prediction for x in xs[50:]])
    np.testing.assert_array_equal(pa, pb)
    # a learner with other combiner settings resumes all but the mixture, warning in one line
    # that names the setting
    key, other = next(iter(kw.items()))
    c = _forecaster(experts(**{key: other + 1}, eta=ETA, window=WINDOW))
    with pytest.warns(UserWarning, match=f"combine.{key}: expected {other + 1}, checkpoint has {other}") as w:
        c.restore(tmp_path / "c.ckpt")
    assert all("\n" not in str(r.message) for r in w)
    rest = [k for k in saved if not k.startswith("combine")]
    assert rest and all(np.array_equal(c.state_dict()[k], saved[k]) for k in rest)


def test_checkpoint_of_another_state_layout_resumes_with_a_fresh_mixture(tmp_path, monkeypatch):
    """A checkpoint of the same settings but another layout of the combiner's state (an older
    release's, e.g. fewer regressors) resumes all else; the mixture starts afresh, with a
    warning in one line naming combine.state."""
    a = _forecaster(experts(max_period=12, eta=ETA, window=WINDOW))
    for x in _series(30):
        a.step(x)
    a.save(tmp_path / "c.ckpt")
    saved, layout = a.state_dict(), experts_module.STATE
    monkeypatch.setattr(experts_module, "STATE", "another layout")
    b = _forecaster(experts(max_period=12, eta=ETA, window=WINDOW))
    fresh = b.state_dict()
    with pytest.warns(UserWarning, match=f"combine.state: expected 'another layout', checkpoint has {re.escape(repr(layout))}") as w:
        b.restore(tmp_path / "c.ckpt")
    assert all("\n" not in str(r.message) for r in w)
    got = b.state_dict()
    assert all(np.array_equal(got[k], fresh[k] if k.startswith("combine") else saved[k]) for k in got)
    assert any(not np.array_equal(saved[k], fresh[k]) for k in saved if k.startswith("combine"))


@pytest.mark.parametrize("kw,match", [
    ({"period": 1}, "period"), ({"period": 2.5}, "period"), ({"eta": 0}, "eta"),
    ({"window": 0}, "window"), ({"clip": float("inf")}, "clip"), ({"max_period": 1}, "max_period"),
    ({"period": 5, "max_period": 9}, "not both")])
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        experts(**kw)


@pytest.mark.parametrize("combine", [None, experts(eta=ETA, window=WINDOW)])
def test_reported_loss_is_the_users_error_in_user_units(combine):
    """With transforms (standardised, residual) and a combiner, a step's loss is the squared error
    of the prediction the stream got, in the units it sent: what replies and stats report."""
    xs = 50.0 + 20.0 * _series(150)                      # far from unit scale
    L = _forecaster(combine)
    preds, losses = [], []
    for x in xs:
        r = L.step(x)
        preds.append(r.prediction)
        losses.append(r.loss[0])
    preds, losses = np.array(preds), np.array(losses)
    scored = ~np.isnan(losses)
    assert scored[-50:].all() and not scored[:20].any()     # after the normaliser's warm-up
    want = np.mean((preds[:-1] - xs[1:]) ** 2, axis=1)
    np.testing.assert_allclose(losses[1:][scored[1:]], want[scored[1:]], rtol=1e-9)


@pytest.mark.parametrize("kw", [pytest.param({"max_period": 12}, marks=pytest.mark.slow), {"period": 12}, {}])
def test_a_step_where_nothing_arrives_changes_nothing_and_repeats_the_prediction(kw):
    """A step where no slot sees, scores or keeps anything leaves every state array as it
    was, bit for bit, and gives the prediction the last step gave for the same model forecast;
    beside a slot that waits, the slot that learns learns as it does alone (the seasonal
    mixture is computed expert by expert, learner/experts.py ``_score_each``)."""
    e = experts(eta=ETA, window=WINDOW, **kw)
    t = np.arange(80)
    y = np.stack([np.sin(2 * np.pi * t / 12), np.cos(2 * np.pi * t / 12) + 0.1 * t / 80], 1)[..., None]
    forecast = jax.jit(e.forecast)
    on, off = np.array([True, True]), np.array([False, False])
    s = e.init(2, 1, np.float64)
    for i in range(60):
        m = 0.9 * y[i]
        s, out = forecast(s, y[i], np.array([i > 0] * 2), on, m, on)
    s2, again = forecast(s, y[60], off, off, m, off)
    for a, b in zip(jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(s2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(again), np.asarray(out), rtol=1e-6)
    one = np.array([True, False])                   # slot 0 learns, slot 1 waits
    s3, _ = forecast(s, y[60], one, one, m, one)
    solo = e.init(1, 1, np.float64)
    for i in range(61):
        solo, _ = forecast(solo, y[i][:1], np.array([i > 0]), np.array([True]), 0.9 * y[min(i, 59)][:1], np.array([True]))
    for a, b, c in zip(jax.tree_util.tree_leaves(s3), jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(solo)):
        np.testing.assert_array_equal(np.asarray(a)[1], np.asarray(b)[1])
        np.testing.assert_allclose(np.asarray(a)[0], np.asarray(c)[0], rtol=1e-5, atol=1e-6)
