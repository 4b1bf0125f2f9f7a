"""The seasons the experts use are reported in ``OnlineLearner.stats()["seasons"]``, against series
whose season is known by construction."""
import numpy as np

import streamtrace as st


def _seasonal(T, period, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(T)
    return (np.sin(2 * np.pi * t / period) + 0.5 * np.cos(4 * np.pi * t / period)
            + 0.05 * rng.standard_normal(T)).astype(np.float32)


def _learner(combine, slots=None):
    return st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32),
                            mode="forecast", combine=combine, slots=slots)


def test_a_detected_season_is_reported_per_slot_and_none_before():
    """Slot 0 sees a season of 9, slot 1 white noise: before any target neither reports a season;
    after 150 steps slot 0 reports (9, 0) and the noise still none."""
    L = _learner(st.experts(max_period=20), slots=st.Slots(2, shared=False))
    assert L.stats()["seasons"].tolist() == [[[0, 0]], [[0, 0]]]
    noise = np.random.default_rng(1).standard_normal(150).astype(np.float32)
    for x0, x1 in zip(_seasonal(150, 9), noise):
        L.step(np.array([[x0], [x1]], np.float32))
    assert L.stats()["seasons"].tolist() == [[[9, 0]], [[0, 0]]]


def test_a_known_period_is_reported_and_no_season_without_one():
    assert _learner(st.experts(period=5)).stats()["seasons"].tolist() == [[[5, 0]]]
    assert "seasons" not in _learner(st.experts()).stats()
