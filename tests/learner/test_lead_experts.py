"""The experts at every lead of a horizon (learner/lead_experts.py) against a numpy mixture written
from the module's equations; lead 1 stays the one-step learner's, bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st
from streamtrace.learner.experts import Experts
from streamtrace.learner.lead_experts import LeadExperts, over_leads

pytestmark = pytest.mark.usefixtures("x64")
H, P, ETA, WINDOW, CLIP = 4, 5, 2.0, 40, 4.0


def np_leads(ys, models):
    """Leads 2..H's mixture for targets ys (T,) and the model's forecasts models (T, H-1), one
    channel, a known period P: returns (T, H-1) the mixed forecasts made at each origin."""
    n, mean, var, hist = 0, 0.0, 0.0, []
    L = np.zeros((H - 1, 4))
    pending = {}                     # origin -> (forecasts (H-1, 4), mixture (H-1,))
    out = []
    for t, y in enumerate(ys):
        scale = var + 1e-12 * (1 + mean ** 2)
        tau = min(WINDOW, 10 + 0.25 * n)
        for h in range(2, H + 1):
            if t - h in pending and n >= 2:
                f, mix = pending[t - h][0][h - 2], pending[t - h][1][h - 2]
                asleep = min((mix - y) ** 2 / scale, CLIP)
                loss = np.array([min((v - y) ** 2 / scale, CLIP) if np.isfinite(v) else asleep for v in f])
                L[h - 2] = (1 - 1 / tau) * L[h - 2] + loss
        w = max(1 / (n + 1), 1 / WINDOW)             # the targets' statistics (learner/experts.py)
        d = y - mean
        mean += w * d
        var = (1 - w) * var + w * d * (y - mean)
        n += 1
        hist.append(y)
        f = np.full((H - 1, 4), np.nan)
        for h in range(2, H + 1):
            back = P * int(np.ceil(h / P)) - h            # y_{t+h-kP} = hist[-1 - back]
            f[h - 2] = [models[t, h - 2], y, mean, hist[-1 - back] if n >= back + 1 else np.nan]
        logits = np.where(np.isfinite(f), -ETA * L, -np.inf)
        wts = np.exp(logits - logits.max(axis=1, keepdims=True))
        wts /= wts.sum(axis=1, keepdims=True)
        mix = np.sum(wts * np.nan_to_num(f), axis=1)
        pending[t] = (f, mix)
        out.append(mix)
    return np.array(out)


def test_every_leads_mixture_equals_numpy():
    rng = np.random.default_rng(3)
    T = 80
    t = np.arange(T + H)
    y = np.sin(2 * np.pi * t / P) + 0.1 * t / T + 0.2 * rng.standard_normal(T + H)
    # a model good at lead 2, poor at lead 3, awful at lead 4: each lead's weights must differ
    models = np.stack([y[2:T + 2] + s * rng.standard_normal(T) for s in (0.05, 0.6, 3.0)], axis=1)
    le = LeadExperts(Experts(period=P, eta=ETA, window=WINDOW, clip=CLIP), H)
    s = le.init(1, 1, jnp.float64)
    one = jnp.ones(1, bool)

    @jax.jit
    def step(s, y, m):
        preds = [jnp.zeros((1, 1))] + [m[None, i:i + 1] for i in range(H - 1)]
        return le.forecast_leads(s, y.reshape(1, 1), one, one, preds, one)
    got = []
    for k in range(T):
        s, out = step(s, jnp.asarray(y[k]), jnp.asarray(models[k]))
        got.append([float(o[0, 0]) for o in out[1:]])
    np.testing.assert_allclose(np.array(got), np_leads(y[:T], models), rtol=1e-10, atol=1e-12)
    w = jax.nn.softmax(-ETA * np.asarray(s["leads"]["L"])[0, :, :, 0], axis=1)
    assert w[0, 0] > 0.5 and w[2, 0] < 0.05          # the model leads at lead 2, not at lead 4


def test_lead_one_is_the_one_step_learners_bit_for_bit():
    xs = np.sin(0.4 * np.arange(60))[:, None].astype(np.float32)
    make = lambda h: st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=6, n_out=1), np.zeros(1, np.float32),
                                      mode=st.Forecast(horizon=h), combine=st.experts(max_period=12))
    a, b = make(1), make(3)
    for x in xs:
        ra, rb = a.step(x), b.step(x)
        np.testing.assert_array_equal(rb.prediction[0], ra.prediction)
        np.testing.assert_array_equal(rb.loss, ra.loss)
    assert b.signature()["combine"]["leads"] == 3 and "leads" not in a.signature()["combine"]


def test_over_leads_and_bad_horizon():
    e = Experts()
    assert over_leads(e, 1) is e and over_leads(None, 4) is None
    assert isinstance(over_leads(e, 2), LeadExperts)
    with pytest.raises(ValueError, match="horizon"):
        LeadExperts(e, 1)
