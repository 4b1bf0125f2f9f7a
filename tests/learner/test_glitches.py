"""A glitching sensor never breaks a stream (learner/screen.py, learner/rollback.py).

A 3,000-row two-channel recording (sines + trend + noise) is forecast by the default learner,
clean and with glitches: one huge finite value of either sign early (warm-up) or late, float
32's maximum into a float32 model, a burst of ten. Scored against the clean recording over the
last 1,000 rows, every glitched run stays within 1.1x the clean run, every glitch is counted
and flagged on its own step, and the clean run has no false alarm. The screen's statistics are
checked against a numpy reference written from its equations; a step that would leave a non-
finite state is undone bit for bit; the same suite runs once through a real ``serve``."""
import math
import time

import numpy as np
import pytest

from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.learner.rolling import RollingMetrics
from streamtrace.learner.screen import screen

ROWS, TAIL = 3000, 1000
F32_MAX = float(np.finfo(np.float32).max)


def recording(seed=0, rows=ROWS):
    """Two channels: sines, a slow trend, noise (the units of a real sensor: not centred on 0)."""
    t = np.arange(rows)
    rng = np.random.default_rng(seed)
    a = 2.0 + np.sin(2 * np.pi * t / 50) + 0.3 * np.sin(2 * np.pi * t / 13) + 1e-3 * t
    b = -1.0 + 0.5 * np.cos(2 * np.pi * t / 80) - 5e-4 * t
    return np.stack([a, b], 1) + 0.05 * rng.normal(size=(rows, 2))


def glitched(x, cells):
    y = x.copy()
    for row, ch, v in cells:
        y[row, ch] = v
    return y


SCENARIOS = {
    "1e6 late": [(1500, 0, 1e6)],
    "-1e6 in warm-up": [(40, 1, -1e6)],
    "1e40 late": [(1500, 0, 1e40)],
    "-1e40 early": [(12, 0, -1e40)],
    "1e6 in the scored tail": [(2500, 1, 1e6)],
    "burst of ten": [(1500 + i, i % 2, (-1) ** i * 10.0 ** (3 + i)) for i in range(10)],
}


def nrmse_tail(pred, truth):
    """Forecasts: the prediction made at row t is of row t + 1."""
    p, y = pred[-TAIL - 1:-1], truth[-TAIL:]
    return float(np.sqrt(np.mean((p - y) ** 2)) / np.std(y))


def run(learner, init, x):
    learner.load_state_dict(init)
    preds, flags = [], []
    for row in x:
        r = learner.step(row)
        preds.append(np.asarray(r.prediction, np.float64))
        flags.append(bool(r.outlier))
    return np.array(preds), np.array(flags), learner.stats()


@pytest.fixture(scope="module")
def default_learner():
    cfg = load_config(None, {"model": {"n_in": 2, "n_out": 2}})
    learner = build_learner(cfg)
    return learner, {k: v.copy() for k, v in learner.state_dict().items()}


@pytest.mark.slow
def test_the_default_learner_shrugs_off_every_glitch(default_learner):
    learner, init = default_learner
    x = recording()
    pred, flags, stats = run(learner, init, x)
    clean = nrmse_tail(pred, x)
    assert clean < 0.5 and stats["outliers"] == 0 and not flags.any(), (clean, stats["outliers"])
    for name, cells in SCENARIOS.items():
        pred, flags, stats = run(learner, init, glitched(x, cells))
        got = nrmse_tail(pred, x)
        assert np.isfinite(pred).all(), name
        assert got <= 1.1 * clean, (name, got, clean)
        rows = sorted({r for r, _, _ in cells})
        assert stats["outliers"] == len(rows), (name, stats["outliers"])
        assert np.flatnonzero(flags).tolist() == rows, name
        m = stats["metrics"]
        assert np.isfinite(m["mse"]).all() and m["nrmse"][0] < 1.0, (name, m)


@pytest.mark.slow
def test_float32_maximum_into_a_float32_model():
    cfg = load_config(None, {"model": {"stack": "gru", "n_in": 2, "n_hidden": 16, "n_out": 2},
                             "transform": {"normalise": True, "residual": True}})
    learner = build_learner(cfg)
    init = {k: v.copy() for k, v in learner.state_dict().items()}
    x = recording().astype(np.float32)
    pred, _, stats = run(learner, init, x)
    clean = nrmse_tail(pred, x)
    for cells in ([(1500, 0, F32_MAX)], [(60, 1, -F32_MAX)]):
        pred, flags, stats = run(learner, init, glitched(x, cells))
        assert np.isfinite(pred).all() and stats["outliers"] == 1 and flags.sum() == 1
        assert nrmse_tail(pred, x) <= 1.1 * clean, (cells, nrmse_tail(pred, x), clean)


@pytest.mark.slow
def test_a_glitched_supervised_target_is_not_learnt_from():
    cfg = load_config(None, {"model": {"n_in": 2, "n_out": 1}, "learning": {"mode": "supervised"}})
    learner = build_learner(cfg)
    init = {k: v.copy() for k, v in learner.state_dict().items()}
    x = recording(seed=2, rows=1500)
    y = np.sin(x[:, :1] * 1.3) + 0.5 * x[:, 1:]
    scores = {}
    for name, ys in (("clean", y), ("glitched", glitched(y, [(700, 0, 1e40), (900, 0, -3e3), (1000, 0, 1e5)]))):
        learner.load_state_dict(init)
        pred = np.array([np.asarray(learner.step(a, b).prediction, np.float64) for a, b in zip(x, ys)])
        scores[name] = float(np.sqrt(np.mean((pred[-500:] - y[-500:]) ** 2)) / np.std(y[-500:]))
        scores[name + " outliers"] = learner.stats()["outliers"]
    assert scores["clean outliers"] == 0 and scores["glitched outliers"] == 3, scores
    assert scores["glitched"] <= 1.1 * scores["clean"], scores


def test_the_clip_policy_learns_a_clipped_value():
    import streamtrace as st
    model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1, seed=0)
    learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
                               transform=st.chain(st.screen("clip", ranges=(-2.0, 2.0)), st.normalise()))
    x = np.sin(0.2 * np.arange(200)).astype(np.float32)
    for v in x:
        learner.step(np.array([v]))
    r = learner.step(np.array([1e9], np.float32))
    assert r.outlier and np.isfinite(r.prediction).all() and learner.stats()["outliers"] == 1
    r = learner.step(np.array([3.0], np.float32))          # out of the hard range, however it goes
    assert r.outlier


# ---- the screen against a numpy reference written from its equations ------------------------------
def reference_flags(x, threshold, rate, growth, warmup):
    """Per channel: running location and mean absolute deviation of the accepted values (a
    plain mean over the first ones), the limit widened by ``growth`` per consecutive outlier, a
    value accepted beyond the plain limit moving the location there."""
    T, C = x.shape
    flags = np.zeros((T, C), bool)
    for c in range(C):
        n, loc, dev, run = 0, 0.0, 0.0, 0
        for t in range(T):
            v = x[t, c]
            base = threshold * max(dev, 1e-9 * (abs(loc) + 1e-9))
            d = abs(v - loc)
            if n >= warmup and d > base * growth ** run:
                flags[t, c] = True
                run += 1
                continue
            a = max(1.0 / (n + 1), rate)
            if run > 0 and d > base and n >= warmup:
                loc, dev = v, max(dev, d / threshold)
            else:
                dev = 0.0 if n == 0 else dev + a * (d - dev)
                loc = loc + a * (v - loc)
            n, run = n + 1, 0
    return flags


def test_the_screen_flags_what_its_equations_say():
    import jax.numpy as jnp
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.normal(size=(600, 3)), 0) * 0.1 + rng.standard_t(3, size=(600, 3))
    x[100, 0], x[300:305, 1], x[5, 2] = 1e5, -4e3, 50.0          # a spike, a burst, an early one
    x[400:, 2] += 80.0                                            # a real change of level
    sc = screen(threshold=8.0, rate=0.02, growth=1.5, warmup=4)
    x = x.astype(np.float32)
    s = sc.init(1, 3, jnp.float32)
    got = []
    for row in x:
        flag, _ = sc.check(s, jnp.asarray(row[None]))
        s = sc.observe(s, jnp.asarray(row[None]), flag, jnp.ones(1, bool))
        got.append(np.asarray(flag[0]))
    want = reference_flags(x, 8.0, 0.02, 1.5, 4)
    assert np.array_equal(np.array(got), want)
    assert want[100, 0] and want[300:305, 1].all() and want[5, 2]
    assert want[400:, 2].sum() <= 10                              # the new level is taken soon
    assert int((np.array(got).any(1)).sum()) == int(want.any(1).sum())


def test_screen_settings_are_checked():
    for bad in (dict(policy="drop"), dict(threshold=0), dict(rate=2.0), dict(growth=1.0), dict(ranges=(2, 1)),
                dict(warmup=0)):
        with pytest.raises(ValueError, match="screen"):
            screen(**bad)
    import streamtrace as st
    model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    with pytest.raises(ValueError, match="first"):
        st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
                         transform=st.chain(st.normalise(), st.screen()))


# ---- rollback -------------------------------------------------------------------------------------
def test_a_step_that_overflows_is_undone_bit_for_bit():
    import streamtrace as st
    model = st.nn.Stack("gru", n_in=1, n_hidden=8, n_out=1, seed=1)
    learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
                               transform=st.chain(st.normalise(), st.residual()))     # no screen
    x = np.sin(0.3 * np.arange(60)).astype(np.float32)
    for v in x:
        learner.step(np.array([v]))
    before = {k: v.copy() for k, v in learner.state_dict().items()}
    r = learner.step(np.array([F32_MAX], np.float32))
    assert r.rolled_back and math.isnan(float(r.loss[0])) and not r.applied
    after = learner.state_dict()
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed == ["rollback.count", "rollback.now"], changed
    assert learner.stats()["rolled_back"] == 1
    r = learner.step(np.array([x[-1]], np.float32))
    assert not r.rolled_back and np.isfinite(r.prediction).all()


def test_rolling_metrics_ignore_an_overflowing_score():
    rm = RollingMetrics(10)
    s = rm.init(2, 1, np.float32)
    s = rm.update(s, np.array([[1.0], [1.0]], np.float32), np.array([[0.0], [0.5]], np.float32), np.ones(2, bool))
    s2 = rm.update(s, np.array([[F32_MAX], [1.0]], np.float32), np.array([[-F32_MAX], [0.0]], np.float32),
                   np.ones(2, bool))
    assert np.array_equal(np.asarray(s2["se"][0]), np.asarray(s["se"][0])) and int(s2["n"][0]) == 1
    assert int(s2["n"][1]) == 2
    m = rm.summary({k: np.asarray(v) for k, v in s2.items()})
    assert np.isfinite(m["mse"]).all()


# ---- through serve ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_flags_counts_and_survives_glitches(tmp_path):
    from engine_helpers import running_engine
    from streamtrace.transport.client import SensorClient
    from streamtrace.transport.subscriber import Subscriber
    x = recording(seed=1)
    cells = SCENARIOS["1e40 late"] + SCENARIOS["-1e6 in warm-up"] + [(2000 + i, 0, 1e8) for i in range(10)]
    bad = glitched(x, cells)
    sections = {"model": {"n_in": 2, "n_out": 2}, "publish": {"stats_every_s": 0.2, "weights_every": 0}}
    with running_engine(tmp_path, sections) as (proc, ep, _):
        sub = Subscriber(ep["pub"], (b"stats",))
        preds, flagged = {}, {}
        for name, data in (("clean", x), ("glitchy", bad)):
            with SensorClient(ep["router"], stream=name) as c:
                c.timeout_ms = 60_000
                out = [c.step(row) for row in data]
            preds[name] = np.array([r.pred for r in out])
            flagged[name] = [i for i, r in enumerate(out) if r.get("outlier")]
        deadline, stats = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            got = sub.recv(0.5)
            if got is not None and got[0] == b"stats":
                stats = got[1]
                if stats.get("stream_events", {}).get("glitchy", {}).get("outliers") == 12:
                    break
        sub.close()
    clean = nrmse_tail(preds["clean"], x)
    assert nrmse_tail(preds["glitchy"], x) <= 1.1 * clean
    assert flagged["clean"] == [] and flagged["glitchy"] == sorted(r for r, _, _ in cells)
    assert stats is not None and stats["stream_events"]["glitchy"] == {"outliers": 12, "rolled_back": 0}
    assert stats["outliers"] == 12 and stats["stream_metrics"]["glitchy"]["outliers"] == 12
    assert np.isfinite(stats["stream_metrics"]["glitchy"]["nrmse"])
