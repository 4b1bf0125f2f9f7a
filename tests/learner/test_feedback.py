"""Targets as inputs (learner/feedback.py) against a hand-fed rollout: the same model (same seed,
n_in + lags * n_out inputs), without feedback, given [x_t, y_{t-1}, ..., y_{t-lags}] built by
numpy, must predict and learn exactly the same; also with slots that pause, micro-batches
(``step_many``) and steps that do not learn."""
import numpy as np

import streamtrace as st
import pytest

from streamtrace.learner import OnlineLearner, feedback, rls
from streamtrace.nn import Stack

N_IN, N_OUT, LAGS, STEPS = 2, 2, 3, 40


def _data(seed):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((STEPS, N_IN)).astype(np.float32)
    ys = np.stack([np.tanh(xs[:, 0] + np.roll(xs[:, 1], 2)), np.sin(0.3 * np.arange(STEPS))], 1).astype(np.float32)
    return xs, ys


def _hand_inputs(xs, ys, learned):
    """numpy: each step's input with the last LAGS targets of the steps that learned."""
    past = np.zeros(LAGS * N_OUT, np.float32)
    out = []
    for x, y, ok in zip(xs, ys, learned):
        out.append(np.concatenate([x, past]))
        if ok:
            past = np.concatenate([y, past[:-N_OUT]])
    return np.array(out)


def _model():
    return Stack("gru", N_IN + LAGS * N_OUT, 5, N_OUT, seed=1)


def test_feedback_equals_the_hand_fed_rollout():
    xs, ys = _data(0)
    learn = np.ones(STEPS, bool)
    learn[[7, 8, 20]] = False                 # steps without a target: nothing new to feed back
    fb = OnlineLearner(_model(), np.zeros(N_IN, np.float32), optimizer=st.adam(1e-2),
                       transform=feedback(LAGS, N_OUT))
    hand = OnlineLearner(_model(), np.zeros(N_IN + LAGS * N_OUT, np.float32), optimizer=st.adam(1e-2))
    zs = _hand_inputs(xs, ys, learn)
    for t in range(STEPS):
        a = fb.step(xs[t], ys[t], learn=np.array([learn[t]]))
        b = hand.step(zs[t], ys[t], learn=np.array([learn[t]]))
        np.testing.assert_allclose(a.prediction, b.prediction, rtol=1e-6, atol=1e-7, err_msg=f"step {t}")
    for k, v in hand.params.items():
        np.testing.assert_allclose(fb.params[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    # the targets fed back are in the state, newest first
    after = _hand_inputs(np.vstack([xs, xs[:1]]), np.vstack([ys, ys[:1]]), np.append(learn, False))[-1]
    np.testing.assert_array_equal(fb.state_dict()["signal.y"][0], after[N_IN:])


def test_feedback_with_slots_and_micro_batches():
    """Two streams, one pausing, stepped four steps per call: each slot's predictions are those of
    the hand-fed rollout of its own stream (per-slot weights, so nothing is shared)."""
    data = [_data(1), _data(2)]
    active = np.ones((STEPS, 2), bool)
    active[10:18, 1] = False
    fb = OnlineLearner(_model(), np.zeros(N_IN, np.float32), optimizer=st.adam(1e-2), slots=st.Slots(2, shared=False),
                       transform=feedback(LAGS, N_OUT))
    got = []
    for t0 in range(0, STEPS, 4):
        xs = np.stack([np.stack([d[0][t] for d in data]) for t in range(t0, t0 + 4)])
        ys = np.stack([np.stack([d[1][t] for d in data]) for t in range(t0, t0 + 4)])
        got += [r.prediction for r in fb.step_many(xs, ys, active=active[t0:t0 + 4])]
    got = np.array(got)
    for s, (xs, ys) in enumerate(data):
        on = active[:, s]
        hand = OnlineLearner(_model(), np.zeros(N_IN + LAGS * N_OUT, np.float32), optimizer=st.adam(1e-2))
        zs = _hand_inputs(xs[on], ys[on], np.ones(on.sum(), bool))
        want = np.array([hand.step(z, y).prediction for z, y in zip(zs, ys[on])])
        np.testing.assert_allclose(got[on, s], want, rtol=1e-5, atol=1e-6, err_msg=f"slot {s}")


def test_feedback_under_an_rls_readout_takes_its_size_from_it():
    from streamtrace.nn import Reservoir
    model = Reservoir(N_IN + N_OUT, 10, seed=0)
    L = OnlineLearner(model, np.zeros(N_IN), optimizer=st.frozen(), readout=rls(N_OUT), transform=feedback())
    xs, ys = _data(3)
    for x, y in zip(xs[:5], ys[:5]):
        r = L.step(x.astype(np.float64), y.astype(np.float64))
    assert np.isfinite(r.prediction).all() and L.state_dict()["readout.W"].shape[-2] == 10 + N_IN + N_OUT + 1


def test_feedback_refuses_forecasts_and_bad_settings():
    with pytest.raises(ValueError, match="supervised"):
        OnlineLearner(Stack("gru", 2 * N_IN, 4, N_IN), np.zeros(N_IN, np.float32), mode="forecast",
                      transform=feedback(1, N_IN))
    with pytest.raises(ValueError, match="size"):
        OnlineLearner(_model(), np.zeros(N_IN, np.float32), transform=feedback(LAGS))
    with pytest.raises(ValueError, match="lags"):
        feedback(0)
