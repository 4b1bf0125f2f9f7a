"""The runner reads the seasons the experts use without jax: the columns the export records
(``Experts.season_columns``) read from a learner's ``combine.aux.int`` give the seasons a series was
made with, as ``OnlineLearner.stats()`` reports them."""
import numpy as np
import streamtrace as st
from streamtrace_runner.stats import seasons_of


def test_the_recorded_columns_give_the_seasons_of_the_series():
    period, t = 7, np.arange(250)
    wave = np.sin(2 * np.pi * t / period) + 0.02 * np.random.default_rng(0).standard_normal(250)
    experts = st.experts(max_period=24)
    L = st.OnlineLearner(st.nn.Stack("gru", n_in=2, n_hidden=4, n_out=2), np.zeros(2, np.float32),
                         mode="forecast", combine=experts, slots=st.Slots(2))
    noise = np.random.default_rng(1).standard_normal(250)
    for a, b in zip(wave, noise):      # channel 0 seasonal, channel 1 noise; slot 1 the other way round
        L.step(np.array([[a, b], [b, a]], np.float32))
    cols = experts.season_columns(2, np.float32)
    got = seasons_of(L.state_dict()["combine.aux.int"], cols)
    want = [period, 0]
    assert got.tolist() == [[want, [0, 0]], [[0, 0], want]]
    np.testing.assert_array_equal(got, L.stats()["seasons"])


def test_a_known_period_is_read_as_found_from_the_start():
    cols = st.experts(period=7).season_columns(1, np.float32)
    assert seasons_of(np.zeros((3, 4), np.int32), cols).tolist() == [[[7, 0]]] * 3
